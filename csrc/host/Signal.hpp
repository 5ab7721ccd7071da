#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace streamnccl {

// Completion of a marked point, shared with the tasks that signal and wait for it.
struct Signal {
  std::mutex mutex;
  std::condition_variable changed;
  // Written under the lock (or before the Signal is shared: alreadySet()); read without it by
  // a look (isSet()), which the watchdog makes of the ops in flight at every launch.
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point doneAt;   // when set(): host events time ops with it
  std::vector<std::function<void()>> onSetCalls;  // run by set(), on its thread

  // One set from the start (a point already passed), made without the lock nor a wake.
  static std::shared_ptr<Signal> alreadySet() {
    auto signal = std::make_shared<Signal>();
    signal->doneAt = std::chrono::steady_clock::now();
    signal->done.store(true, std::memory_order_release);
    return signal;
  }

  void set() {
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::function<void()>> calls;
    {
      std::lock_guard<std::mutex> lock(mutex);
      doneAt = now;  // before done: a look that sees it set finds its time
      done = true;
      calls = std::move(onSetCalls);
    }
    changed.notify_all();
    for (auto& call : calls) {
      call();
    }
  }
  // Runs `call` once set: now if it has been, else on the thread that sets it.
  void onSet(std::function<void()> call) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!done) {
        onSetCalls.push_back(std::move(call));
        return;
      }
    }
    call();
  }
  bool isSet() const { return done.load(std::memory_order_acquire); }
  bool waitFor(std::chrono::milliseconds timeout) {
    if (isSet() || timeout.count() <= 0) {
      return isSet();  // a look: a wait of no time would still cost a system call and the lock
    }
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return done.load(); });
  }
  // When set() was called, if it has been.
  std::optional<std::chrono::steady_clock::time_point> doneTime() {
    std::lock_guard<std::mutex> lock(mutex);
    return done ? std::optional(doneAt) : std::nullopt;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return done.load(); });
  }
};

}  // namespace streamnccl
