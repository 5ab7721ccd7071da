#include "host/HostWorker.hpp"

#include <c10/util/thread_name.h>

namespace streamnccl {

void HostWorker::startThreadLocked() {
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      c10::setThreadName("streamnccl-host");  // what py-spy, gdb and top show
      loop();
    });
    // Before the thread can take a task: it waits for the lock this caller holds.
    workerId_ = thread_.get_id();
  }
}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (!thread_.joinable()) {
    return;  // never needed: every task ran on its caller
  }
  // Joining from the worker itself (the last owner released inside a task) would deadlock.
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void HostWorker::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    startThreadLocked();
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void HostWorker::runInOrder(const std::function<void()>& task) {
  if (std::this_thread::get_id() == workerId_.load()) {
    // Called from a task (a future callback issuing a sync op): waiting for the queue would
    // wait for ourselves. Inline is in order too: every rank runs it at the same point.
    task();
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!busy_ && tasks_.empty()) {
      busy_ = true;
    } else {
      startThreadLocked();
      bool done = false;
      tasks_.push_back([&] {
        task();
        std::lock_guard<std::mutex> doneLock(mutex_);
        done = true;
      });
      wake_.notify_one();
      // `idle_` is notified after every task, so this wakes once ours has run.
      idle_.wait(lock, [&] { return done; });
      return;
    }
  }
  task();
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    waiting = !tasks_.empty() || stopping_;
  }
  // Tasks enqueued while the caller ran this one (or a stop) wait for the worker. Waking it
  // for nothing would cost every sync op a context switch of the idle worker.
  if (waiting) {
    wake_.notify_one();
  }
}

void HostWorker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return (!tasks_.empty() && !busy_) || (stopping_ && !busy_); });
    if (tasks_.empty()) {
      return;  // stopping, and nothing left to run
    }
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    lock.unlock();
    task();
    task = nullptr;  // release what the task held before the next one starts
    lock.lock();
    busy_ = false;
    idle_.notify_all();
  }
}

}  // namespace streamnccl
