#include "cuda/CudaDevice.hpp"

#include <algorithm>
#include <thread>

namespace streamnccl {
namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(std::shared_ptr<CudaApi> cuda, std::shared_ptr<CudaEventPool> pool)
      : cuda_(std::move(cuda)), pool_(std::move(pool)), event_(pool_->take()) {}
  ~CudaEvent() override { pool_->give(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record(c10::Stream stream) override { cuda_->recordEvent(event_, stream); }
  void block(c10::Stream stream) override { cuda_->streamWaitEvent(stream, event_); }
  bool query() override { return cuda_->queryEvent(event_); }

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
  const std::shared_ptr<CudaApi> cuda_;
  const std::shared_ptr<CudaEventPool> pool_;
  const cudaEvent_t event_;
};

// Makes a stream current for a scope, as c10's CUDAStreamGuard, through the CudaApi.
class CurrentStreamGuard {
 public:
  CurrentStreamGuard(CudaApi& cuda, c10::Stream stream)
      : cuda_(cuda), previous_(cuda.exchangeCurrentStream(stream)) {}
  ~CurrentStreamGuard() { cuda_.exchangeCurrentStream(previous_); }
  CurrentStreamGuard(const CurrentStreamGuard&) = delete;
  CurrentStreamGuard& operator=(const CurrentStreamGuard&) = delete;

 private:
  CudaApi& cuda_;
  const c10::Stream previous_;
};

}  // namespace

CudaEventPool::CudaEventPool(std::shared_ptr<CudaApi> cuda, c10::Device device)
    : cuda_(std::move(cuda)), device_(device) {}

CudaEventPool::~CudaEventPool() {
  for (cudaEvent_t event : free_) {
    cuda_->destroyEvent(device_, event);
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
  return cuda_->createEvent(device_);
}

// An event may go back still pending: a stream that waits on it has already captured that
// record (cudaStreamWaitEvent binds to the latest record at the time of the call), so the
// next record on it changes nothing for that stream.
void CudaEventPool::give(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(event);
}

CudaDevice::CudaDevice(std::shared_ptr<CudaApi> cuda, c10::Device device, bool highPriority)
    : cuda_(std::move(cuda)),
      device_(device),
      highPriority_(highPriority),
      events_(std::make_shared<CudaEventPool>(cuda_, device)) {}

c10::Stream CudaDevice::internalStream() {
  std::call_once(internalCreated_,
                 [&] { internal_ = cuda_->streamFromPool(device_, highPriority_); });
  return *internal_;
}

std::unique_ptr<Event> CudaDevice::createEvent() {
  return std::make_unique<CudaEvent>(cuda_, events_);
}

void CudaDevice::enqueue(c10::Stream stream, std::function<void()> task) {
  CurrentStreamGuard guard(*cuda_, stream);
  task();
}

}  // namespace streamnccl
