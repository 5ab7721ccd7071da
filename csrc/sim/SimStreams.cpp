#include "sim/SimStreams.hpp"

#include <c10/util/Exception.h>

namespace streamnccl::sim {

SimStream::SimStream(uint64_t seed, std::chrono::microseconds maxDelay)
    : random_(seed), maxDelay_(maxDelay), thread_([this] { loop(); }) {}

SimStream::~SimStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    held_ = false;
  }
  changed_.notify_all();
  thread_.join();
}

void SimStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  changed_.notify_all();
}

void SimStream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return tasks_.empty() && !busy_; });
}

void SimStream::hold(bool held) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_ = held;
  }
  changed_.notify_all();
}

void SimStream::reseed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  random_.seed(seed);
}

void SimStream::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return (!tasks_.empty() && !held_) || stopping_; });
    if (tasks_.empty()) {
      return;
    }
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    const auto delay = std::chrono::microseconds(
        maxDelay_.count() > 0 ? random_() % static_cast<uint64_t>(maxDelay_.count() + 1) : 0);
    lock.unlock();
    std::this_thread::sleep_for(delay);
    task();
    task = nullptr;
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

SimStreams::SimStreams(uint64_t seed, std::chrono::microseconds maxDelay)
    : maxDelay_(maxDelay), seed_(seed) {
  create();  // the caller's stream, id 0
}

c10::Stream SimStreams::streamFor(c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCPU), id);
}

c10::Stream SimStreams::create() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto id = static_cast<c10::StreamId>(streams_.size());
  streams_.push_back(std::make_unique<SimStream>(seed_ * 1000003 + id, maxDelay_));
  if (id > kCallerStream) {
    streams_.back()->hold(internalHeld_);
  }
  return streamFor(id);
}

SimStream& SimStreams::operator[](c10::Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_INTERNAL_ASSERT(stream.id() >= 0 && stream.id() < static_cast<int64_t>(streams_.size()),
                        "streamnccl sim: unknown stream ", stream.id());
  return *streams_[stream.id()];
}

void SimStreams::reseed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  for (size_t id = 0; id < streams_.size(); ++id) {
    streams_[id]->reseed(seed * 1000003 + id);
  }
}

void SimStreams::holdInternalStreams(bool held) {
  std::lock_guard<std::mutex> lock(mutex_);
  internalHeld_ = held;
  for (size_t id = 1; id < streams_.size(); ++id) {
    streams_[id]->hold(held);
  }
}

}  // namespace streamnccl::sim
