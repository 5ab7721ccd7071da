#include "cuda/CudaDevice.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include <thread>

namespace streamnccl {
namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(std::shared_ptr<CudaEventPool> pool, c10::Device device)
      : pool_(std::move(pool)), device_(device), event_(pool_->take()) {}
  ~CudaEvent() override { pool_->give(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record(c10::Stream stream) override {
    c10::cuda::CUDAGuard guard(device_);
    C10_CUDA_CHECK(cudaEventRecord(event_, c10::cuda::CUDAStream(stream).stream()));
  }
  void block(c10::Stream stream) override {
    c10::cuda::CUDAGuard guard(device_);
    C10_CUDA_CHECK(cudaStreamWaitEvent(c10::cuda::CUDAStream(stream).stream(), event_, 0));
  }
  bool query() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it so that later checks do not see it
      return false;
    }
    C10_CUDA_CHECK(status);
    return true;
  }

  bool synchronize(std::chrono::milliseconds timeout) override {
    // Polled rather than cudaEventSynchronize, which cannot time out.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(20);
    while (!query()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    return true;
  }

 private:
  const std::shared_ptr<CudaEventPool> pool_;
  const c10::Device device_;
  const cudaEvent_t event_;
};

}  // namespace

CudaEventPool::CudaEventPool(c10::Device device) : device_(device) {}

CudaEventPool::~CudaEventPool() {
  c10::cuda::CUDAGuard guard(device_);
  for (cudaEvent_t event : free_) {
    C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
  }
}

cudaEvent_t CudaEventPool::take() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t event = free_.back();
      free_.pop_back();
      return event;
    }
  }
  c10::cuda::CUDAGuard guard(device_);
  cudaEvent_t event = nullptr;
  // Timing off: a timing event costs more to record and is not needed to order streams.
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

// An event may go back still pending: a stream that waits on it has already captured that
// record (cudaStreamWaitEvent binds to the latest record at the time of the call), so the
// next record on it changes nothing for that stream.
void CudaEventPool::give(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(event);
}

CudaDevice::CudaDevice(c10::Device device, bool highPriority)
    : device_(device),
      highPriority_(highPriority),
      events_(std::make_shared<CudaEventPool>(device)) {}

c10::Stream CudaDevice::currentStream() {
  return c10::cuda::getCurrentCUDAStream(device_.index()).unwrap();
}

c10::Stream CudaDevice::internalStream() {
  std::call_once(internalCreated_,
                 [&] { internal_ = c10::cuda::getStreamFromPool(highPriority_, device_.index()); });
  return internal_->unwrap();
}

std::unique_ptr<Event> CudaDevice::createEvent() {
  return std::make_unique<CudaEvent>(events_, device_);
}

void CudaDevice::enqueue(c10::Stream stream, std::function<void()> task) {
  c10::cuda::CUDAStreamGuard guard(c10::cuda::CUDAStream(stream));
  task();
}

}  // namespace streamnccl
