#pragma once

#include "core/Device.hpp"

#include <c10/cuda/CUDAStream.h>

#include <mutex>
#include <optional>

namespace streamnccl {

// The Device of the NCCL path: the caller's current CUDA stream, one internal stream per
// group and device (from c10's pool, made on first async op), and CUDA events.
class CudaDevice final : public Device {
 public:
  CudaDevice(c10::Device device, bool highPriority);

  c10::Device device() const override { return device_; }
  c10::Stream currentStream() override;
  c10::Stream internalStream() override;
  std::unique_ptr<Event> createEvent() override;
  // Runs the task now, with `stream` current on this device, so that the NCCL calls and ATen
  // kernels it issues are enqueued on `stream`.
  void enqueue(c10::Stream stream, std::function<void()> task) override;

 private:
  const c10::Device device_;
  const bool highPriority_;
  std::once_flag internalCreated_;
  std::optional<c10::cuda::CUDAStream> internal_;
};

}  // namespace streamnccl
