#pragma once

// The CUDA runtime calls the NCCL path makes, one virtual each and nothing more, so that the
// recording fake (csrc/fake/) can stand in for the runtime where there is no GPU and check
// each call as the runtime would: against the calling thread's current device and stream
// capture, and the devices of the streams and events it names. runtime() forwards to the CUDA
// runtime and c10's per-thread current streams. It sets no device of its own: callers make
// the device current with useDevice() wherever a call needs it.

#include "core/Device.hpp"

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <cuda_runtime_api.h>

#include <memory>

namespace streamnccl {

// While alive, a device is the calling thread's current one (see CudaApi::useDevice).
class DeviceScope {
 public:
  virtual ~DeviceScope() = default;
};

class CudaApi {
 public:
  virtual ~CudaApi() = default;
  static std::shared_ptr<CudaApi> runtime();

  // The type of the tensors the NCCL path moves: CUDA (the fakes': CPU, on a fake GPU).
  virtual c10::DeviceType tensorsType() const { return c10::kCUDA; }
  // Throws c10::Error with the reason when this process cannot use `device`.
  virtual void checkUsable(const c10::Device& device) = 0;
  // Makes `device` the calling thread's current device until the scope ends, then the previous
  // one again. A thread that had none gets none back: a fresh thread that touched the runtime
  // without a device would make a context on device 0 (hundreds of MiB on someone's GPU).
  virtual std::unique_ptr<DeviceScope> useDevice(const c10::Device& device) = 0;
  // major * 10 + minor.
  virtual int computeCapability(const c10::Device& device) = 0;

  // The calling thread's current stream on `device`.
  virtual c10::Stream currentStream(const c10::Device& device) = 0;
  // Makes `stream` current on its device for the calling thread; returns the one it replaced.
  virtual c10::Stream exchangeCurrentStream(c10::Stream stream) = 0;
  // cudaStreamCreateWithPriority(cudaStreamNonBlocking) on the current device: a stream of
  // the caller's own, unlike c10's pool, which hands the same streams to users too.
  virtual c10::Stream createStream(bool highPriority) = 0;
  virtual void destroyStream(c10::Stream stream) = 0;
  virtual cudaStream_t native(c10::Stream stream) = 0;
  // cudaStreamIsCapturing: whether work enqueued on `stream` now goes into a CUDA graph.
  virtual bool isCapturing(c10::Stream stream) = 0;
  // cudaThreadExchangeStreamCaptureMode for the calling thread; returns the previous mode.
  virtual cudaStreamCaptureMode exchangeCaptureMode(cudaStreamCaptureMode mode) = 0;

  // cudaEventCreateWithFlags on the current device: with cudaEventDisableTiming unless
  // `timing` (a timing event costs more to record; only timed ops need one).
  virtual cudaEvent_t createEvent(bool timing) = 0;
  virtual void destroyEvent(cudaEvent_t event) = 0;
  // With the stream's device current.
  virtual void recordEvent(cudaEvent_t event, c10::Stream stream) = 0;
  virtual void streamWaitEvent(c10::Stream stream, cudaEvent_t event) = 0;
  // cudaEventQuery, with the event's device current; never blocks. Unanswered where CUDA
  // refuses the query without anything being wrong with the device (the calling thread is
  // capturing, or the event was recorded in a capture); throws on any other error, which means
  // the device has failed.
  enum class EventStatus { Passed, Pending, Unanswered };
  virtual EventStatus queryEvent(cudaEvent_t event) = 0;
  // cudaEventElapsedTime, with the events' device current: both made with timing, both passed.
  virtual float elapsedMs(cudaEvent_t start, cudaEvent_t end) = 0;

  // The devices a future over tensors of `device` names, so that its then() callbacks are
  // ordered after the work that completed it: the device itself. (The fake's tensors are CPU
  // tensors, whose c10 futures can name no device: it notes the request instead.)
  virtual std::vector<c10::Device> futureDevices(const c10::Device& device) = 0;

  // An ATen kernel of the NCCL path (core/Kernels.hpp), issued on the calling thread's current
  // stream: the runtime runs it, ATen enqueuing it there; the fake makes it a stream item.
  virtual void launchKernel(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                            c10::ArrayRef<at::Tensor> inputs, int64_t scalar) = 0;
};

}  // namespace streamnccl
