#include "sim/SimController.hpp"

#include <ATen/ATen.h>

namespace streamnccl::sim {

at::Tensor SimRead::value(std::chrono::milliseconds timeout) const {
  TORCH_CHECK(signal_->waitFor(timeout), "streamnccl sim: the caller's stream did not reach the ",
              "read within ", timeout.count(), " ms");
  return *copy_;
}

SimController::SimController(SimSettings settings)
    : settings_(settings),
      streams_(std::make_shared<SimStreams>(settings.seed, settings.maxDelay)) {}

c10::intrusive_ptr<ProcessGroup> SimController::processGroup(
    int rank, int size, std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> gloo) {
  auto options = c10::make_intrusive<Options>();
  options->timeout = timeout;
  ProcessGroup::PathFactories factories;
  factories.emplace(c10::kCPU, std::make_unique<SimPathFactory>(streams_, std::move(gloo),
                                                                settings_.dropDependencies));
  return ProcessGroup::make(rank, size, options, std::move(factories));
}

void SimController::write(const at::Tensor& destination, const at::Tensor& value) {
  (*streams_)[streams_->callerStream()].enqueue(
      [destination, value = value.clone()] { destination.copy_(value); });
}

SimRead SimController::read(const at::Tensor& source) {
  SimRead read;
  (*streams_)[streams_->callerStream()].enqueue([source, signal = read.signal_, copy = read.copy_] {
    *copy = source.clone();
    signal->set();
  });
  return read;
}

void SimController::synchronize() { (*streams_)[streams_->callerStream()].synchronize(); }

}  // namespace streamnccl::sim
