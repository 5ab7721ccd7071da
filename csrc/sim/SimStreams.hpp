#pragma once

// Test-only. The streams of a simulated GPU: every stream, the caller's included, is an
// executor thread that runs its tasks in order, each after a random delay, so the host call
// that enqueued a task has long returned when it runs, as with a CUDA stream. Delays come
// from a seeded generator per stream: one seed, one schedule family.

#include <c10/core/Stream.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace streamnccl::sim {

class SimStream {
 public:
  SimStream(uint64_t seed, std::chrono::microseconds maxDelay);
  // Runs what is enqueued, then joins.
  ~SimStream();
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  void enqueue(std::function<void()> task);
  // Blocks the host until every task enqueued so far has run.
  void synchronize();
  // A held stream runs no task until released: an op on it is stuck.
  void hold(bool held);
  void reseed(uint64_t seed);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  std::mt19937_64 random_;
  const std::chrono::microseconds maxDelay_;
  bool busy_ = false;
  bool held_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

// The streams of one simulated device, shared by every path (and lane) of a group on it:
// they all see the same caller's stream, as CUDA paths see one current stream.
class SimStreams {
 public:
  SimStreams(uint64_t seed, std::chrono::microseconds maxDelay);

  static constexpr c10::StreamId kCallerStream = 0;
  c10::Stream callerStream() const { return streamFor(kCallerStream); }
  // A new internal stream.
  c10::Stream create();
  SimStream& operator[](c10::Stream stream);

  void reseed(uint64_t seed);
  // Holds (or releases) every internal stream, those made later included.
  void holdInternalStreams(bool held);

 private:
  static c10::Stream streamFor(c10::StreamId id);

  const std::chrono::microseconds maxDelay_;
  std::mutex mutex_;
  uint64_t seed_;
  bool internalHeld_ = false;
  std::vector<std::unique_ptr<SimStream>> streams_;  // index: stream id
};

}  // namespace streamnccl::sim
