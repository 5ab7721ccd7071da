#pragma once

// How a group watches its ops, how it ends on the first fault, and how it ends at its
// destruction. Shared by the group, the tasks of its ops and their Works, which may outlive
// the group by a moment.
//
// Every op's Work is tracked from launch until its end event has passed (the Work holds the
// op's tensors meanwhile, Device.hpp rule 5). A thread looks at them every period: those whose
// end has passed are recorded and handed back, to let go of their tensors on a caller's thread
// (releasing a tensor may need the GIL, and CUDA memory the caller's device); one past its
// deadline breaks the group, and so does an asynchronous error of any communicator, or a
// device error met looking at an event. The thread never drops the last reference to a Work
// (it only moves them between its lists) and never fails one with its lock held (failing runs
// the future's callbacks, which may call back into the group).
//
// Breaking the group, from whichever fault (a timeout, a failed op, a failed connection, a
// debug-check mismatch, a device error, wait(timeout), abort(), a failed split or shrink of
// one of its communicators, a shrink with NCCL_SHRINK_ABORT), is one procedure, run once:
// the group is marked broken with the cause (later calls raise it at once) and its flight
// recorder dumped; every op in flight fails; every communicator is aborted, so that peers and
// queued kernels stop instead of waiting forever; the failed ops' tensors go only once their
// end has passed, since the kernels after the communicator's (copy-backs, divisions) still run.
//
// The rule this keeps: a communicator's kernels are stopped only by its group's break, which
// fails every op in flight first. An op whose kernel quit passes its end event like one that
// ran: were the kernels stopped first, the watchdog could retire the op as completed. So
// nothing else aborts a communicator that ops have used: a failed split or shrink asks the
// group to break (Communicator::setBreakRequest), and a shrink with NCCL_SHRINK_ABORT, whose
// NCCL call stops the kernels itself, breaks the group first and aborts the communicators
// only after (Kernels::StoppedByCaller; the lanes, which NCCL does not shrink, right after
// the break). Either waits, when its break lost the race, until the winning break has failed
// the ops (awaitOpsFailed). The communicator's own aborts are of one no op is using: still
// connecting, or closed at the group's end once its ops have ended.
//
// At the group's end (finish() and close()) the ops in flight are waited for, up to the
// group's timeout, and the communicators then closed in order; only a broken group, or ops
// still unfinished at the timeout, abort them instead.

#include "core/BreakBoard.hpp"
#include "core/Communicator.hpp"
#include "core/CompletionHooks.hpp"
#include "core/GroupHealth.hpp"
#include "core/GroupStats.hpp"
#include "core/OpsInFlight.hpp"
#include "core/Work.hpp"

#include <c10/util/ScopeExit.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace streamnccl {

class Watchdog final : public std::enable_shared_from_this<Watchdog>, public WorkWatcher {
 public:
  using Clock = std::chrono::steady_clock;

  // `describeGroup` names the group in the watchdog's own messages; it is called only until
  // describeGroupAs() (or stop()).
  // `stats`: where each op's end is counted.
  // `board`: where breaks are shared with the other ranks (null: they are not), watched from
  // now on.
  static std::shared_ptr<Watchdog> start(std::shared_ptr<GroupHealth> health,
                                         std::shared_ptr<GroupStats> stats,
                                         std::function<OpInfo()> describeGroup,
                                         std::shared_ptr<BreakBoard> board = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Stops the thread (idempotent). Called at the group's end, after finish().
  void stop();
  // From now on the group is named `group` without asking it (the group object may go first).
  void describeGroupAs(const OpInfo& group);

  GroupHealth& health() { return *health_; }
  CompletionHooks& completionHooks() { return *hooks_; }

  // A communicator of the group: polled for asynchronous errors, aborted when the group
  // breaks, at once if it is broken already; a fault it meets outside an op breaks the group.
  void watch(std::shared_ptr<Communicator> communicator);
  // Keeps `work` (and its tensors) until its end event has passed or the group has broken.
  void track(c10::intrusive_ptr<Work> work);
  // Keeps a captured op's Work, which holds what its replays use, until wait() has joined it
  // or the group ends: a Work dropped unwaited still holds them.
  void trackCaptured(c10::intrusive_ptr<Work> work);
  // How far a look at the ops in flight goes.
  using Look = OpsInFlight::Look;
  // Lets go of the ops whose end has passed, on the calling thread; `clock` dates what the
  // flight recorder notes of them.
  void releaseCompleted(RecorderClock& clock, Look look = Look::All);
  void releaseCompleted() {
    RecorderClock clock;
    releaseCompleted(clock);
  }

  // Breaks the group with `error` (see above); `group` names it. Any thread; only the first
  // call breaks it. `failCause` fails the ops whose failure this is, on every call: once the
  // group's evidence (the flight recorder's dump) is written, so that whoever learns of a
  // failure finds it there, and before the other ops in flight fail with the group's error,
  // so that those ops keep their own; it is handed `news`, what the roll call found
  // (BreakBoard::describeSilent, often empty), for their errors (withNews()).
  // With a board, the first call first posts the break for the other ranks (unless learned from
  // them) and waits for the roll call (up to BreakBoard::kRollCall), whose news every error of
  // the break then carries.
  // `kernels`: Abort, the break aborts every communicator; StoppedByCaller, the caller stops
  // their kernels itself and then calls abortCommunicators() (a shrink with NCCL_SHRINK_ABORT,
  // which needs the communicators it stops).
  enum class Kernels { Abort, StoppedByCaller };
  struct BreakAs {
    GroupHealth::Cause cause = GroupHealth::Cause::Fault;
    Kernels kernels = Kernels::Abort;
    // Shared with the other ranks (a shrink with NCCL_SHRINK_ABORT, which they all make, is not).
    bool shared = true;
    // Waits for the other ranks' answers, to name the silent (an abort, whose caller knows its
    // cause, does not).
    bool rollCall = true;
  };
  using FailCause = std::function<void(const std::string& news)>;
  void breakGroup(const OpInfo& group, std::exception_ptr error, const FailCause& failCause,
                  BreakAs as);
  void breakGroup(const OpInfo& group, std::exception_ptr error, const FailCause& failCause = {}) {
    breakGroup(group, std::move(error), failCause, BreakAs());
  }
  // `cause` with the roll call's news after its message (`cause` itself where there is none).
  static std::exception_ptr withNews(std::exception_ptr cause, const std::string& news);
  // A caller met a device error, `cause`, looking at `work`: the group breaks with it, and the
  // op fails once the dump is written (as settle() does for those the thread meets).
  void failOnDeviceError(Work& work, std::exception_ptr cause) override;
  void breakOnWaitTimeout(const OpInfo& op, std::exception_ptr error) override {
    breakGroup(op, std::move(error), {}, BreakAs{GroupHealth::Cause::Timeout});
  }

  // Waits until every op in flight has ended, the group breaks, or `deadline` passes (at the
  // group's end). True when every op ended (and the group is not broken).
  bool finish(Clock::time_point deadline);
  // The same for the ops issued on `communicators` alone (all where empty), while the group
  // goes on: a split waits so for the ops on the communicators it splits.
  bool finishOn(const std::vector<const Communicator*>& communicators, Clock::time_point deadline);
  // The ops still in flight, described, for the message of a teardown that gives up.
  std::vector<std::string> unfinished();
  void abortCommunicators();
  // Once the group is broken, for a caller that stops kernels itself next (a failed split's
  // abort of its parent, a shrink with NCCL_SHRINK_ABORT) or tells of the break (getError()):
  // waits (up to a minute, then logs) until the break that won has failed the ops in flight;
  // at once on the winner's thread.
  void awaitOpsFailed();
  // The group's teardown, the group broken: every op in flight has failed when this returns,
  // by the break or here, so that aborting next stops no kernel of an op not yet failed.
  void failInFlightOfBrokenGroup();
  // Once the group is broken: aborts every communicator but `kept` (those a shrink with
  // NCCL_SHRINK_ABORT hands to NCCL, which stops their kernels itself).
  void abortCommunicatorsBut(const std::vector<const Communicator*>& kept);
  // Closes every communicator in order (Communicator::beginClose, then endClose), by
  // `deadline`; returns what had to be aborted or left instead, one line each.
  std::vector<std::string> closeCommunicators(Clock::time_point deadline);
  // Lets go of every op still held, at the group's end, after its communicators closed or
  // were aborted. A failed op whose end has not passed by `deadline` keeps its tensors for
  // good (returned: how many), rather than free memory its kernels may still use.
  size_t releaseAll(Clock::time_point deadline);
  // Every communicator still connecting gives up.
  void stopConnecting();

 private:
  using Works = std::vector<c10::intrusive_ptr<Work>>;

  Watchdog(std::shared_ptr<GroupHealth> health, std::shared_ptr<GroupStats> stats,
           std::function<OpInfo()> describeGroup, std::shared_ptr<BreakBoard> board);
  // A break another rank posted on the board: the group breaks with it (REMOTE_ERROR). On the
  // watchdog's thread (check()), which alone collects ended ops.
  void learnBreak(const BreakBoard::Post& post);
  // breakGroup()'s sharing of the break it claimed: posts it (unless learned from the board),
  // then returns the roll call's news. Empty without a board, or for a break not shared.
  // A local fault whose break another rank posted first becomes Remote in `as`.
  std::string shareBreak(const std::exception_ptr& error, BreakAs& as);
  OpInfo describeGroup();
  // One period of the thread: waits for it, then check(); false once stop() was called.
  bool waitThenCheck();
  void check();
  // With mutex_ held: moves the ops whose end has passed (in flight, as far as `look` goes, or
  // failed and waiting for it) to ended_, and marks started ones in the flight recorder. Those
  // whose event query met a device error move to `faulted` instead, to be failed without the lock
  // (settle()).
  void collectEnded(Works& faulted, RecorderClock& clock, Look look = Look::All);
  // Without the lock: fails the `faulted` ops, puts them with the ended ones, and breaks the
  // group with the first fault (a device error, or a timing read that failed). Does nothing
  // when there is none.
  void settle(Works& faulted);
  // Counts the op's end, completed or failed, once: in the flight recorder and the stats. A
  // device error reading its duration is kept in timingFault_.
  void retire(Work& work);
  void retire(Work& work, RecorderClock& clock);
  // Fails `works` with `reason` and keeps them until their end has passed (failedRunning_).
  void failUntilTheirEnd(Works& works, const std::string& reason);
  // A break's caller has failed the ops it took out of inFlight_ (see opsOutside_).
  void handOnFailed(Works& works);
  // A guard for ops taken out of inFlight_: those never handed on (the break threw first) fail
  // when it goes, and are handed on.
  c10::scope_exit<std::function<void()>> handOnIfNeverFailed(Works& works);
  // The break that won: waits until no op taken out by another caller is left unfailed.
  void awaitOpsOutside();
  // Counts the op's end as a failure with `error` before the op fails (the group's dump must
  // hold it first), once, as retire() does.
  void retireFailed(Work& work, const std::exception_ptr& error);
  // The group's communicators still alive, taken with mutex_ held (the caller holds it when
  // `locked`), to be called into without it: a call may take long (abort, asyncError).
  std::vector<std::shared_ptr<Communicator>> liveCommunicators(bool locked = false);

  const std::shared_ptr<GroupHealth> health_;
  const std::shared_ptr<GroupStats> stats_;
  const std::shared_ptr<BreakBoard> board_;  // null: breaks stay on this rank
  const std::shared_ptr<CompletionHooks> hooks_ = std::make_shared<CompletionHooks>();
  std::mutex describeMutex_;  // describeGroup_ is replaced by describeGroupAs()
  std::function<OpInfo()> describeGroup_;

  std::mutex mutex_;
  OpsInFlight inFlight_;
  Works failedRunning_;  // failed from outside (timeout, break), end not yet passed
  Works ended_;          // end passed: released by releaseCompleted()
  Works captured_;       // captured, not yet joined
  std::vector<std::weak_ptr<Communicator>> communicators_;
  bool aborted_ = false;
  std::once_flag abortOnce_;
  std::string brokenReason_;  // set once the group is broken
  std::string breakNews_;     // what the break's roll call found, for every op's error
  // Where the group's break is: None -> FailingOps (the break that won took the ops in flight,
  // on thread breaker_) -> OpsFailed (every one of them failed; a caller that stops kernels
  // after a break that lost waits for this). No other move (asserted).
  enum class Breaking { None, FailingOps, OpsFailed };
  static constexpr std::pair<Breaking, Breaking> kBreakingMoves[] = {
      {Breaking::None, Breaking::FailingOps},
      {Breaking::FailingOps, Breaking::OpsFailed},
  };
  Breaking breaking_ = Breaking::None;
  // Ops taken out of inFlight_ to be failed by a break's caller (check() at a deadline,
  // learnBreak()), not yet failed. Such a caller may lose the claim to another break, which
  // must not stop their kernels before they have failed: its OpsFailed waits for this to reach
  // 0 (bounded), so that no op whose kernels were stopped is ever seen to succeed.
  size_t opsOutside_ = 0;
  std::thread::id breaker_;
  std::condition_variable opsFailedChanged_;
  static constexpr std::chrono::seconds kBreakWait{60};

  // A device error reading a duration, not yet reported (retire() runs with and without
  // mutex_ held, so it has a lock of its own).
  std::mutex timingFaultMutex_;
  std::exception_ptr timingFault_;
  std::atomic<bool> timingFaulted_{false};  // timingFault_ is set

  std::mutex stopMutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::mutex joinMutex_;
  std::thread thread_;
};

}  // namespace streamnccl
