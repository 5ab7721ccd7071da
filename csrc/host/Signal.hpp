#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

namespace streamnccl {

// Completion of a marked point, shared with the tasks that signal and wait for it.
struct Signal {
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;
  std::chrono::steady_clock::time_point doneAt;  // when set(): host events time ops with it

  void set() {
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      doneAt = now;
    }
    changed.notify_all();
  }
  bool waitFor(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return done; });
  }
  // When set() was called, if it has been.
  std::optional<std::chrono::steady_clock::time_point> doneTime() {
    std::lock_guard<std::mutex> lock(mutex);
    return done ? std::optional(doneAt) : std::nullopt;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return done; });
  }
};

}  // namespace streamnccl
