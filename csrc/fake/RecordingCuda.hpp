#pragma once

// Test-only. CudaApi over a FakeGpu: every call is written to the GPU's log and checked as the
// runtime would check it (see FakeGpu). The recorded group's tensors are CPU tensors; its
// streams are c10::Streams on their device, with the fake's stream numbers as ids.

#include "cuda/CudaApi.hpp"
#include "fake/FakeGpu.hpp"

#include <memory>

namespace streamnccl::fake {

// Fake handles are small integers cast to the library's pointer types; 0 stays null.
template <typename Handle>
Handle handle(int64_t number) {
  return reinterpret_cast<Handle>(static_cast<intptr_t>(number + 1));
}
template <typename Handle>
int64_t number(Handle value) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(value)) - 1;
}

class RecordingCuda final : public CudaApi {
 public:
  // `tensorsDevice`: the device of the recorded group's tensors, which its streams carry.
  RecordingCuda(std::shared_ptr<FakeGpu> gpu, c10::Device tensorsDevice)
      : gpu_(std::move(gpu)), tensorsDevice_(tensorsDevice) {}

  c10::DeviceType tensorsType() const override { return tensorsDevice_.type(); }
  void checkUsable(const c10::Device&) override {}  // the fake device is always there
  std::unique_ptr<DeviceScope> useDevice(const c10::Device& device) override;
  int computeCapability(const c10::Device&) override { return gpu_->computeCapability(); }

  c10::Stream currentStream(const c10::Device& device) override;
  c10::Stream exchangeCurrentStream(c10::Stream stream) override;
  c10::Stream createStream(bool highPriority) override;
  void destroyStream(c10::Stream stream) override { gpu_->destroyStream(stream.id()); }
  cudaStream_t native(c10::Stream stream) override { return handle<cudaStream_t>(stream.id()); }
  bool isCapturing(c10::Stream stream) override { return gpu_->isCapturing(stream.id()); }
  cudaStreamCaptureMode exchangeCaptureMode(cudaStreamCaptureMode mode) override {
    return gpu_->exchangeCaptureMode(mode);
  }

  cudaEvent_t createEvent(bool timing) override {
    return handle<cudaEvent_t>(gpu_->createEvent(timing));
  }
  void destroyEvent(cudaEvent_t event) override { gpu_->destroyEvent(number(event)); }
  void recordEvent(cudaEvent_t event, c10::Stream stream) override {
    gpu_->recordEvent(number(event), stream.id());
  }
  void streamWaitEvent(c10::Stream stream, cudaEvent_t event) override {
    gpu_->streamWaitEvent(stream.id(), number(event));
  }
  EventStatus queryEvent(cudaEvent_t event) override { return gpu_->queryEvent(number(event)); }
  float elapsedMs(cudaEvent_t start, cudaEvent_t end) override {
    return gpu_->elapsedMs(number(start), number(end));
  }
  // The group's tensors are CPU tensors, whose c10 futures can name no device: the request
  // is noted for the tests instead (FakeGpu::futuresNamingDevice).
  std::vector<c10::Device> futureDevices(const c10::Device& device) override {
    gpu_->noteFutureDevice(device);
    return {};
  }
  void launchKernel(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                    c10::ArrayRef<at::Tensor> inputs, int64_t scalar) override {
    gpu_->launchAten(kernel, outputs, inputs, scalar);
  }

 private:
  const std::shared_ptr<FakeGpu> gpu_;
  const c10::Device tensorsDevice_;
};

}  // namespace streamnccl::fake
