#pragma once

// c10d's completion hooks (Backend::registerOnCompletionHook, torch's
// `_register_on_completion_hook`, used for monitoring): each hook is told of every op of the
// group that completes, once, in the order the watchdog retires them, with c10d's WorkInfo (op
// type, sequence number, when it was issued and retired, and how long it ran on its stream).
//
// The watchdog only queues an op (retire() may hold its lock); the hooks run on a thread of
// their own, started with the first hook, which holds none of the group's locks (a hook may
// call into the group, or take the GIL, as torch's Python wrapper does). A hook that raises is
// logged and the group goes on. Failed ops are not reported: WorkInfo cannot say so, and a
// monitor would count them as done.

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace streamnccl {

class CompletionHooks : public std::enable_shared_from_this<CompletionHooks> {
 public:
  using Hook = std::function<void(std::shared_ptr<c10d::WorkInfo>)>;
  using Clock = std::chrono::steady_clock;

  ~CompletionHooks() { stop(); }

  // `who` names the group in the log.
  void add(Hook hook, std::string who);
  // Whether any hook is registered (read on every launch: an atomic load).
  bool active() const { return active_.load(std::memory_order_acquire); }
  // An op completed: queued for the hooks.
  void completed(c10d::OpType opType, uint64_t seq, Clock::time_point issued,
                 std::optional<double> durationMs);
  // Returns once the hooks have been told of every op queued so far (at once on the hooks' own
  // thread), or `deadline` passed (false).
  bool drain(Clock::time_point deadline);
  // Tells the hooks of every op queued, then ends the thread (at the group's end); on the
  // hooks' own thread (a hook that let go of the group), without waiting for that. The thread
  // holds this object until it ends.
  void stop();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Hook> hooks_;
  std::string who_;
  std::deque<std::shared_ptr<c10d::WorkInfo>> queue_;
  bool stopping_ = false;
  bool telling_ = false;  // the thread is in the hooks
  std::atomic<bool> active_{false};
  std::thread thread_;
};

}  // namespace streamnccl
