#pragma once

// Test-only. A Device whose streams are SimStreams, so that the core's stream contract can be
// checked on CPU under randomized schedules, with the host communicator moving the data.

#include "core/Path.hpp"
#include "sim/SimStreams.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>

namespace streamnccl::sim {

struct SimSettings {
  uint64_t seed = 0;
  std::chrono::microseconds maxDelay{0};
  // The mutation: events never make a stream wait, as if the core inserted no dependencies.
  // The ordering tests must fail with it set.
  bool dropDependencies = false;
};

// Hands out turns in the order ops were enqueued, across streams. It models what NCCL does
// for one communicator: its ops execute in the order they were issued, whichever streams
// they were issued on.
struct Turnstile {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t issued = 0;
  uint64_t next = 0;
};

class SimDevice final : public Device {
 public:
  SimDevice(std::shared_ptr<SimStreams> streams, bool dropDependencies);

  c10::Device device() const override { return c10::Device(c10::kCPU); }
  c10::Stream currentStream() override { return streams_->callerStream(); }
  c10::Stream internalStream() override;
  std::unique_ptr<Event> createEvent() override;
  // Queues the task on `stream`; it runs there after a random delay, and after every task
  // enqueued on this device before it.
  void enqueue(c10::Stream stream, Task task) override;

 private:
  const std::shared_ptr<SimStreams> streams_;
  const bool dropDependencies_;
  std::once_flag internalCreated_;
  c10::Stream internal_;
  const std::shared_ptr<Turnstile> turnstile_ = std::make_shared<Turnstile>();
};

// Opens simulated paths and lanes on one set of SimStreams, each with a host communicator.
class SimPathFactory final : public PathFactory {
 public:
  SimPathFactory(std::shared_ptr<SimStreams> streams, c10::intrusive_ptr<c10d::Backend> gloo,
                 bool dropDependencies);
  std::unique_ptr<Path> open(const c10::Device& device) override;
  PeerLanes openPeer(const c10::Device& device, int peer) override;
  std::unique_ptr<Path> openAnySource(const c10::Device& device) override;
  std::unique_ptr<PathFactory> split(const c10::intrusive_ptr<c10d::Store>& store,
                                     const std::vector<int>& ranks,
                                     const c10::intrusive_ptr<Options>& options) override;

 private:
  std::unique_ptr<Path> path(int tag);

  const std::shared_ptr<SimStreams> streams_;
  const c10::intrusive_ptr<c10d::Backend> gloo_;
  const bool dropDependencies_;
};

}  // namespace streamnccl::sim
