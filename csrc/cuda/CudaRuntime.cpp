// CudaApi::runtime(): c10's CUDA streams and the CUDA runtime's events.

#include "cuda/CudaApi.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace streamnccl {
namespace {

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
  c10::Stream currentStream(const c10::Device& device) override {
    return c10::cuda::getCurrentCUDAStream(device.index()).unwrap();
  }
  c10::Stream streamFromPool(const c10::Device& device, bool highPriority) override {
    return c10::cuda::getStreamFromPool(highPriority, device.index()).unwrap();
  }
  c10::Stream exchangeCurrentStream(c10::Stream stream) override {
    const c10::Stream previous = currentStream(stream.device());
    c10::cuda::setCurrentCUDAStream(c10::cuda::CUDAStream(stream));
    return previous;
  }
  cudaStream_t native(c10::Stream stream) override {
    return c10::cuda::CUDAStream(stream).stream();
  }

  cudaEvent_t createEvent(const c10::Device& device) override {
    c10::cuda::CUDAGuard guard(device);
    cudaEvent_t event = nullptr;
    // Timing off: a timing event costs more to record and is not needed to order streams.
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void destroyEvent(const c10::Device& device, cudaEvent_t event) override {
    c10::cuda::CUDAGuard guard(device);
    C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
  }
  void recordEvent(cudaEvent_t event, c10::Stream stream) override {
    c10::cuda::CUDAGuard guard(stream.device());
    C10_CUDA_CHECK(cudaEventRecord(event, native(stream)));
  }
  void streamWaitEvent(c10::Stream stream, cudaEvent_t event) override {
    c10::cuda::CUDAGuard guard(stream.device());
    C10_CUDA_CHECK(cudaStreamWaitEvent(native(stream), event, 0));
  }
  bool queryEvent(cudaEvent_t event) override {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it so that later checks do not see it
      return false;
    }
    C10_CUDA_CHECK(status);
    return true;
  }
};

}  // namespace

std::shared_ptr<CudaApi> CudaApi::runtime() {
  static const auto runtime = std::make_shared<CudaRuntime>();
  return runtime;
}

}  // namespace streamnccl
