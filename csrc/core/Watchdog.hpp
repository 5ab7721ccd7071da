#pragma once

// How a group watches its ops and how it ends on the first fault. Shared by the group, the
// tasks of its ops and their Works, which may outlive the group by a moment.
//
// Every op's Work is tracked from launch until its end event has passed (the Work holds the
// op's tensors meanwhile, Device.hpp rule 5). A thread looks at them every period: completed
// ones are recorded, and handed back to be released on a caller's thread (releasing a tensor
// may need the GIL, and CUDA memory the caller's device); one past its deadline breaks the
// group, and so does an asynchronous error of any communicator.
//
// Breaking the group, from whichever fault (a timeout, a failed op, a failed connection, a
// debug-check mismatch, wait(timeout), abort()), is one procedure, run once: the group is
// marked broken with the cause (later calls raise it at once) and its flight recorder dumped;
// every op in flight fails; every communicator is aborted, so that peers and queued kernels
// stop instead of waiting forever; only then are the failed ops' tensors let go, since until
// the abort has returned their kernels may still be using them.

#include "core/Communicator.hpp"
#include "core/GroupHealth.hpp"
#include "core/GroupStats.hpp"
#include "core/Work.hpp"

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace streamnccl {

class Watchdog : public std::enable_shared_from_this<Watchdog> {
 public:
  // `describeGroup` names the group in the watchdog's own messages; it is called only until
  // stop().
  // `stats`: where each op's end is counted.
  static std::shared_ptr<Watchdog> start(std::shared_ptr<GroupHealth> health,
                                         std::shared_ptr<GroupStats> stats,
                                         std::function<OpInfo()> describeGroup);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Stops the thread (idempotent). Called before the group goes, and at interpreter exit.
  void stop();

  GroupHealth& health() { return *health_; }

  // A communicator of the group: polled for asynchronous errors, aborted when the group
  // breaks, at once if it is broken already.
  void watch(std::shared_ptr<Communicator> communicator);
  // Keeps `work` (and its tensors) until its end event has passed or the group has broken.
  void track(c10::intrusive_ptr<Work> work);
  // Lets go of the ops that are done, on the calling thread.
  void releaseCompleted();

  // Breaks the group with `error` (see above); `group` names it. Any thread; only the first
  // call does anything.
  void breakGroup(const OpInfo& group, std::exception_ptr error);

  // At the group's end: true when its communicators must be aborted rather than destroyed,
  // because the group broke or ops have not completed (destroying a communicator waits for
  // its kernels, which a dead peer would never end).
  bool mustAbortAtTeardown();
  void abortCommunicators();
  // Lets go of every op still held, completed or not (at the group's end, after any abort).
  void releaseAll();
  // Every communicator still connecting gives up (at interpreter exit).
  void stopConnecting();

 private:
  Watchdog(std::shared_ptr<GroupHealth> health, std::shared_ptr<GroupStats> stats,
           std::function<OpInfo()> describeGroup);
  void loop();
  void check();
  // Moves the completed ops of inFlight_ to done_. With mutex_ held.
  void collectCompleted();
  // Counts the op's end, completed or failed, once: in the flight recorder and the stats.
  void retire(Work& work);
  // The group's communicators still alive, taken with mutex_ held (the caller holds it when
  // `locked`), to be called into without it: a call may take long (abort, asyncError).
  std::vector<std::shared_ptr<Communicator>> liveCommunicators(bool locked = false);

  const std::shared_ptr<GroupHealth> health_;
  const std::shared_ptr<GroupStats> stats_;
  const std::function<OpInfo()> describeGroup_;

  std::mutex mutex_;
  std::vector<c10::intrusive_ptr<Work>> inFlight_;
  std::vector<c10::intrusive_ptr<Work>> done_;  // released by releaseCompleted()
  std::vector<std::weak_ptr<Communicator>> communicators_;
  bool aborted_ = false;
  std::once_flag abortOnce_;
  std::string brokenReason_;  // set once the group is broken

  std::mutex stopMutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::mutex joinMutex_;
  std::thread thread_;
};

}  // namespace streamnccl
