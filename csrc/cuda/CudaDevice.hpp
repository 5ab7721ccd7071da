#pragma once

#include "core/Device.hpp"
#include "cuda/CudaApi.hpp"

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace streamnccl {

// CUDA events for reuse: every async op records two, and creating one costs a driver call.
// An event goes back to the pool when its Event is destroyed (its Work, or the launch, is
// done with it); the pool outlives every Event that holds it.
class CudaEventPool {
 public:
  CudaEventPool(std::shared_ptr<CudaApi> cuda, c10::Device device);
  ~CudaEventPool();
  CudaEventPool(const CudaEventPool&) = delete;
  CudaEventPool& operator=(const CudaEventPool&) = delete;

  cudaEvent_t take();
  void give(cudaEvent_t event);

 private:
  const std::shared_ptr<CudaApi> cuda_;
  const c10::Device device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// The Device of the NCCL path: the caller's current CUDA stream, one internal stream per
// group and device (from c10's pool, made on first async op), and pooled CUDA events.
class CudaDevice final : public Device {
 public:
  CudaDevice(std::shared_ptr<CudaApi> cuda, c10::Device device, bool highPriority);

  c10::Device device() const override { return device_; }
  c10::Stream currentStream() override { return cuda_->currentStream(device_); }
  c10::Stream internalStream() override;
  std::unique_ptr<Event> createEvent() override;
  // Runs the task now, with `stream` current on this device, so that the NCCL calls and ATen
  // kernels it issues are enqueued on `stream`.
  void enqueue(c10::Stream stream, std::function<void()> task) override;

 private:
  const std::shared_ptr<CudaApi> cuda_;
  const c10::Device device_;
  const bool highPriority_;
  std::once_flag internalCreated_;
  std::optional<c10::Stream> internal_;
  const std::shared_ptr<CudaEventPool> events_;
};

}  // namespace streamnccl
