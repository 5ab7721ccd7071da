#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace streamnccl {

// Completion of a marked point, shared with the tasks that signal and wait for it.
struct Signal {
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;

  void set() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    changed.notify_all();
  }
  bool waitFor(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return done; });
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return done; });
  }
};

}  // namespace streamnccl
