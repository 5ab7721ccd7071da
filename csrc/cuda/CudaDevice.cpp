#include "cuda/CudaDevice.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <thread>

namespace streamnccl {
namespace {

class CudaEvent final : public Event {
 public:
  // Timing off: a timing event costs more to record and is not needed to order streams.
  CudaEvent() : event_(cudaEventDisableTiming) {}

  void record(c10::Stream stream) override { event_.record(c10::cuda::CUDAStream(stream)); }
  void block(c10::Stream stream) override { event_.block(c10::cuda::CUDAStream(stream)); }
  bool query() override { return event_.query(); }

  bool synchronize(std::chrono::milliseconds timeout) override {
    // Polled rather than cudaEventSynchronize, which cannot time out.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(20);
    while (!event_.query()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    return true;
  }

 private:
  at::cuda::CUDAEvent event_;
};

}  // namespace

CudaDevice::CudaDevice(c10::Device device, bool highPriority)
    : device_(device), highPriority_(highPriority) {}

c10::Stream CudaDevice::currentStream() {
  return c10::cuda::getCurrentCUDAStream(device_.index()).unwrap();
}

c10::Stream CudaDevice::internalStream() {
  std::call_once(internalCreated_,
                 [&] { internal_ = c10::cuda::getStreamFromPool(highPriority_, device_.index()); });
  return internal_->unwrap();
}

std::unique_ptr<Event> CudaDevice::createEvent() { return std::make_unique<CudaEvent>(); }

void CudaDevice::enqueue(c10::Stream stream, std::function<void()> task) {
  c10::cuda::CUDAStreamGuard guard(c10::cuda::CUDAStream(stream));
  task();
}

}  // namespace streamnccl
