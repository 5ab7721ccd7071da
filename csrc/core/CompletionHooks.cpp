#include "core/CompletionHooks.hpp"

#include "core/GroupThreads.hpp"

#include <c10/util/Logging.h>
#include <c10/util/thread_name.h>

namespace streamnccl {

void CompletionHooks::add(Hook hook, std::string who) {
  std::lock_guard<std::mutex> lock(mutex_);
  hooks_.push_back(std::move(hook));
  who_ = std::move(who);
  if (!thread_.joinable() && !stopping_) {
    thread_ = std::thread([self = shared_from_this()] { self->run(); });
  }
  active_.store(true, std::memory_order_release);
}

void CompletionHooks::completed(c10d::OpType opType, uint64_t seq, Clock::time_point issued,
                                std::optional<double> durationMs) {
  const auto now = Clock::now();
  // An op issued before the first hook was registered has no time of issue: its retiring's.
  auto info = std::make_shared<c10d::WorkInfo>(
      opType, seq, issued == Clock::time_point{} ? now : issued, now,
      std::chrono::duration<float>(durationMs.value_or(0) / 1e3));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      return;
    }
    queue_.push_back(std::move(info));
  }
  changed_.notify_all();  // the thread, not a drain(), must wake
}

void CompletionHooks::run() {
  c10::setThreadName("streamnccl-hook");
  markGroupThread();  // a hook that lets go of the group: its teardown runs apart
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });  // notify_all: shared
    if (queue_.empty()) {
      return;  // stopping, and all told
    }
    auto info = std::move(queue_.front());
    queue_.pop_front();
    const std::vector<Hook> hooks = hooks_;
    const std::string who = who_;
    telling_ = true;
    lock.unlock();
    for (const Hook& hook : hooks) {
      try {
        hook(info);
      } catch (const std::exception& e) {
        LOG(ERROR) << who << " a completion hook raised (the group goes on): " << e.what();
      } catch (...) {
        LOG(ERROR) << who << " a completion hook raised (the group goes on)";
      }
    }
    lock.lock();
    telling_ = false;
    changed_.notify_all();  // drain() waits for this
  }
}

bool CompletionHooks::drain(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (thread_.get_id() == std::this_thread::get_id()) {
    return true;  // a hook asking: waiting would wait for itself
  }
  return changed_.wait_until(
      lock, deadline, [this] { return !thread_.joinable() || (queue_.empty() && !telling_); });
}

void CompletionHooks::stop() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  changed_.notify_all();
  if (!thread.joinable()) {
    return;
  }
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();  // a hook's own teardown: the thread tells the rest, then ends
  } else {
    thread.join();
  }
}

}  // namespace streamnccl
