#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace streamnccl {

// The host path's internal stream: one thread that runs tasks in the order they were
// enqueued. Destruction runs every task already enqueued, then joins. The thread starts with
// the first task that needs it: a group whose ops are all sync runs them on its callers.
class HostWorker {
 public:
  HostWorker() = default;
  ~HostWorker();
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  void enqueue(std::function<void()> task);
  // Runs `task` after every task enqueued before it and returns once it has run. When the
  // worker is idle the task runs on the calling thread: same order, no thread hand-off.
  void runInOrder(const std::function<void()>& task);

 private:
  void loop();
  void startThreadLocked();  // with `mutex_` held

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false;  // a task is running, on the worker or on a caller
  bool stopping_ = false;
  std::thread thread_;
  // The worker's id, read without the lock by callers asking whether they are it.
  std::atomic<std::thread::id> workerId_{};
};

}  // namespace streamnccl
