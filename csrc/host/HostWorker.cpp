#include "host/HostWorker.hpp"

#include "core/GroupThreads.hpp"

#include <c10/util/thread_name.h>

namespace streamnccl {

void HostWorker::startThreadLocked() {
  if (!thread_.joinable()) {
    thread_ = std::thread([state = state_] {
      c10::setThreadName("streamnccl-host");  // what py-spy, gdb and top show
      markGroupThread();
      loop(state);
    });
    // Before the thread can take a task: it waits for the lock this caller holds.
    state_->workerId = thread_.get_id();
  }
}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (!thread_.joinable()) {
    return;  // never needed: every task ran on its caller
  }
  // Joining from the worker itself (the last owner let go inside a task) would deadlock: the
  // thread, detached, runs what is left with the state it shares.
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void HostWorker::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    startThreadLocked();
    state_->tasks.push_back(std::move(task));
  }
  state_->wake.notify_one();
}

void HostWorker::runInOrder(const Task& task) {
  State& state = *state_;
  if (std::this_thread::get_id() == state.workerId.load()) {
    // Called from a task (a future callback issuing a sync op): waiting for the queue would
    // wait for ourselves. Inline is in order too: every rank runs it at the same point.
    task();
    return;
  }
  {
    std::unique_lock<std::mutex> lock(state.mutex);
    if (!state.busy && state.tasks.empty()) {
      state.busy = true;
    } else {
      startThreadLocked();
      bool done = false;
      state.tasks.push_back([&] {
        task();
        std::lock_guard<std::mutex> doneLock(state.mutex);
        done = true;
      });
      state.wake.notify_one();
      // `idle` is notified after every task, so this wakes once ours has run.
      state.idle.wait(lock, [&] { return done; });
      return;
    }
  }
  task();
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.busy = false;
    waiting = !state.tasks.empty() || state.stopping;
  }
  // Tasks enqueued while the caller ran this one (or a stop) wait for the worker. Waking it
  // for nothing would cost every sync op a context switch of the idle worker.
  if (waiting) {
    state.wake.notify_one();
  }
}

void HostWorker::loop(const std::shared_ptr<State>& shared) {
  State& state = *shared;
  std::unique_lock<std::mutex> lock(state.mutex);
  while (true) {
    state.wake.wait(lock, [&] {
      return (!state.tasks.empty() && !state.busy) || (state.stopping && !state.busy);
    });
    if (state.tasks.empty()) {
      return;  // stopping, and nothing left to run
    }
    auto task = std::move(state.tasks.front());
    state.tasks.pop_front();
    state.busy = true;
    lock.unlock();
    task();
    task = nullptr;  // release what the task held before the next one starts
    lock.lock();
    state.busy = false;
    state.idle.notify_all();
  }
}

}  // namespace streamnccl
