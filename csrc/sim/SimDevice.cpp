#include "sim/SimDevice.hpp"

#include "host/HostCommunicator.hpp"
#include "host/Signal.hpp"

namespace streamnccl::sim {
namespace {

class SimEvent final : public Event {
 public:
  SimEvent(std::shared_ptr<SimStreams> streams, bool dropDependencies)
      : streams_(std::move(streams)), dropDependencies_(dropDependencies) {}

  void record(c10::Stream stream) override {
    signal_ = std::make_shared<Signal>();
    (*streams_)[stream].enqueue([signal = signal_] { signal->set(); });
  }

  void block(c10::Stream stream) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl sim: event blocked on before being recorded");
    if (!dropDependencies_) {
      (*streams_)[stream].enqueue([signal = signal_] { signal->wait(); });
    }
  }

  bool query() override { return signal_ && signal_->waitFor(std::chrono::milliseconds(0)); }

  bool synchronize(std::chrono::milliseconds timeout) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl sim: event synchronized before being recorded");
    return signal_->waitFor(timeout);
  }

 private:
  const std::shared_ptr<SimStreams> streams_;
  const bool dropDependencies_;
  std::shared_ptr<Signal> signal_;
};

// Gloo tags, as on the host path: the group's stream and the lanes run concurrently.
constexpr int kGroupTag = 0;
constexpr int kLaneTag = 1;

}  // namespace

SimDevice::SimDevice(std::shared_ptr<SimStreams> streams, bool dropDependencies)
    : streams_(std::move(streams)),
      dropDependencies_(dropDependencies),
      internal_(streams_->callerStream()) {}

c10::Stream SimDevice::internalStream() {
  std::call_once(internalCreated_, [&] { internal_ = streams_->create(); });
  return internal_;
}

std::unique_ptr<Event> SimDevice::createEvent() {
  return std::make_unique<SimEvent>(streams_, dropDependencies_);
}

void SimDevice::enqueue(c10::Stream stream, Task task) {
  uint64_t turn = 0;
  {
    std::lock_guard<std::mutex> lock(turnstile_->mutex);
    turn = turnstile_->issued++;
  }
  (*streams_)[stream].enqueue([turnstile = turnstile_, turn, task = std::move(task).take()] {
    {
      std::unique_lock<std::mutex> lock(turnstile->mutex);
      turnstile->changed.wait(lock, [&] { return turnstile->next == turn; });
    }
    task();
    {
      std::lock_guard<std::mutex> lock(turnstile->mutex);
      ++turnstile->next;
    }
    turnstile->changed.notify_all();
  });
}

SimPathFactory::SimPathFactory(std::shared_ptr<SimStreams> streams,
                               c10::intrusive_ptr<c10d::Backend> gloo, bool dropDependencies)
    : streams_(std::move(streams)), gloo_(std::move(gloo)), dropDependencies_(dropDependencies) {}

std::unique_ptr<Path> SimPathFactory::path(int tag) {
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<SimDevice>(streams_, dropDependencies_);
  path->communicator = std::make_shared<HostCommunicator>(gloo_, tag);
  return path;
}

std::unique_ptr<Path> SimPathFactory::open(const c10::Device& device) {
  TORCH_CHECK(device.is_cpu(), "the simulated device serves cpu tensors, not ", device);
  return path(kGroupTag);
}

PeerLanes SimPathFactory::openPeer(const c10::Device& device, int /*peer*/) {
  TORCH_CHECK(device.is_cpu(), "the simulated device serves cpu tensors, not ", device);
  return {path(kLaneTag), path(kLaneTag)};
}

std::unique_ptr<Path> SimPathFactory::openAnySource(const c10::Device& device) {
  TORCH_CHECK(device.is_cpu(), "the simulated device serves cpu tensors, not ", device);
  return path(kLaneTag);
}

std::unique_ptr<PathFactory> SimPathFactory::split(const c10::intrusive_ptr<c10d::Store>&,
                                                   const std::vector<int>&,
                                                   const c10::intrusive_ptr<Options>&) {
  TORCH_CHECK(false, "streamnccl sim: a simulated group cannot be split");
}

}  // namespace streamnccl::sim
