#pragma once

// The CUDA streams and events the NCCL path uses, behind one interface so that the recording
// fake (csrc/fake/) can stand in for the runtime where there is no GPU. runtime() is the real
// one, over c10's CUDA streams and the CUDA runtime's events.

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <cuda_runtime_api.h>

#include <memory>

namespace streamnccl {

class CudaApi {
 public:
  virtual ~CudaApi() = default;
  static std::shared_ptr<CudaApi> runtime();

  // Throws c10::Error with the reason when this process cannot use `device`.
  virtual void checkUsable(const c10::Device& device) = 0;
  // The calling thread's current stream on `device`.
  virtual c10::Stream currentStream(const c10::Device& device) = 0;
  virtual c10::Stream streamFromPool(const c10::Device& device, bool highPriority) = 0;
  // Makes `stream` current on its device for the calling thread; returns the one it replaced.
  virtual c10::Stream exchangeCurrentStream(c10::Stream stream) = 0;
  virtual cudaStream_t native(c10::Stream stream) = 0;

  virtual cudaEvent_t createEvent(const c10::Device& device) = 0;
  virtual void destroyEvent(const c10::Device& device, cudaEvent_t event) = 0;
  virtual void recordEvent(cudaEvent_t event, c10::Stream stream) = 0;
  virtual void streamWaitEvent(c10::Stream stream, cudaEvent_t event) = 0;
  // True once the recorded work has run. Never blocks.
  virtual bool queryEvent(cudaEvent_t event) = 0;
};

}  // namespace streamnccl
