#pragma once

#include "core/Task.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
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
  void runInOrder(const Task& task);

 private:
  // What the worker thread uses. Shared with the thread, so that when the last owner of the
  // HostWorker lets go of it inside a task (a future callback dropping its group), the thread,
  // left detached, still finds all of it to run the tasks left and end.
  struct State {
    std::mutex mutex;
    std::condition_variable wake;
    std::condition_variable idle;
    std::deque<std::function<void()>> tasks;
    bool busy = false;  // a task is running, on the worker or on a caller
    bool stopping = false;
    // The worker's id, read without the lock by callers asking whether they are it.
    std::atomic<std::thread::id> workerId{};
  };

  static void loop(const std::shared_ptr<State>& state);
  void startThreadLocked();  // with `state_->mutex` held

  const std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace streamnccl
