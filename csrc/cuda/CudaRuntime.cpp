// CudaApi::runtime(): the CUDA runtime and c10's per-thread current streams, one call each.

#include "cuda/CudaApi.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace streamnccl {
namespace {

class CudaDeviceScope final : public DeviceScope {
 public:
  explicit CudaDeviceScope(const c10::Device& device) : guard_(device) {}

 private:
  // c10's guard restores "no device" to a thread that had none, without making a context.
  c10::cuda::OptionalCUDAGuard guard_;
};

class CudaRuntime final : public CudaApi {
 public:
  void checkUsable(const c10::Device& device) override {
    TORCH_CHECK(device.is_cuda() && device.has_index(), "expected an indexed cuda device, got ",
                device);
    const auto visible = c10::cuda::device_count();
    TORCH_CHECK(visible > 0, "this process sees no CUDA device (no GPU or driver present)");
    TORCH_CHECK(device.index() < visible, "this process sees ", static_cast<int>(visible),
                " CUDA device(s), so ", device, " does not exist");
  }
  std::unique_ptr<DeviceScope> useDevice(const c10::Device& device) override {
    // Already current, for c10 and for the runtime alike (every call of a one-device
    // process): the guard would change nothing, so there is no scope to allocate on the launch
    // path. Both are asked: c10 may hold a device it has not set yet (its lazy target, for a
    // device without a context), which the guard would clear, and which c10's own calls in the
    // scope (stream labels, a future's events) would use. cudaGetDevice makes no context.
    c10::DeviceIndex c10Current = -1;
    int runtimeCurrent = -1;
    if (c10::cuda::GetDevice(&c10Current) == cudaSuccess && c10Current == device.index() &&
        cudaGetDevice(&runtimeCurrent) == cudaSuccess && runtimeCurrent == device.index()) {
      return nullptr;
    }
    return std::make_unique<CudaDeviceScope>(device);
  }
  int computeCapability(const c10::Device& device) override {
    int major = 0;
    int minor = 0;
    C10_CUDA_CHECK(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index()));
    C10_CUDA_CHECK(
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index()));
    return major * 10 + minor;
  }

  c10::Stream currentStream(const c10::Device& device) override {
    return c10::cuda::getCurrentCUDAStream(device.index()).unwrap();
  }
  c10::Stream exchangeCurrentStream(c10::Stream stream) override {
    const c10::Stream previous = currentStream(stream.device());
    c10::cuda::setCurrentCUDAStream(c10::cuda::CUDAStream(stream));
    return previous;
  }
  c10::Stream createStream(bool highPriority) override {
    int leastPriority = 0;
    int greatestPriority = 0;
    C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&leastPriority, &greatestPriority));
    cudaStream_t stream = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                                highPriority ? greatestPriority : leastPriority));
    return c10::cuda::getStreamFromExternal(stream, c10::cuda::current_device()).unwrap();
  }
  void destroyStream(c10::Stream stream) override {
    C10_CUDA_CHECK_WARN(cudaStreamDestroy(native(stream)));
  }
  cudaStream_t native(c10::Stream stream) override {
    return c10::cuda::CUDAStream(stream).stream();
  }
  bool isCapturing(c10::Stream stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(native(stream), &status));
    return status != cudaStreamCaptureStatusNone;
  }
  cudaStreamCaptureMode exchangeCaptureMode(cudaStreamCaptureMode mode) override {
    C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    return mode;
  }

  cudaEvent_t createEvent(bool timing) override {
    cudaEvent_t event = nullptr;
    C10_CUDA_CHECK(
        cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
    return event;
  }
  void destroyEvent(cudaEvent_t event) override { C10_CUDA_CHECK_WARN(cudaEventDestroy(event)); }
  void recordEvent(cudaEvent_t event, c10::Stream stream) override {
    C10_CUDA_CHECK(cudaEventRecord(event, native(stream)));
  }
  void streamWaitEvent(c10::Stream stream, cudaEvent_t event) override {
    C10_CUDA_CHECK(cudaStreamWaitEvent(native(stream), event, 0));
  }
  EventStatus queryEvent(cudaEvent_t event) override {
    const cudaError_t status = cudaEventQuery(event);
    switch (status) {
      case cudaSuccess:
        return EventStatus::Passed;
      case cudaErrorNotReady:
        (void)cudaGetLastError();  // not an error: clear it so that later checks do not see it
        return EventStatus::Pending;
      case cudaErrorStreamCaptureUnsupported:
      case cudaErrorStreamCaptureInvalidated:
      case cudaErrorCapturedEvent:
        // A capture forbids the query (it is invalidated if it was the thread's own): the
        // device is fine, the answer only unknown for now.
        (void)cudaGetLastError();
        return EventStatus::Unanswered;
      default:
        C10_CUDA_CHECK(status);
        return EventStatus::Passed;
    }
  }
  float elapsedMs(cudaEvent_t start, cudaEvent_t end) override {
    float ms = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
    return ms;
  }
  std::vector<c10::Device> futureDevices(const c10::Device& device) override { return {device}; }
  void launchKernel(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                    c10::ArrayRef<at::Tensor> inputs, int64_t scalar) override {
    kernel.run(outputs, inputs, scalar);
  }
};

}  // namespace

std::shared_ptr<CudaApi> CudaApi::runtime() {
  static const auto runtime = std::make_shared<CudaRuntime>();
  return runtime;
}

}  // namespace streamnccl
