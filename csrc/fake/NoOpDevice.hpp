#pragma once

// Bench-only. CUDA and NCCL calls that do nothing and succeed at once: every event has passed,
// every communicator is ready, no kernel is enqueued (an ATen kernel of the path runs at once
// on the host). Under the NCCL path they leave only streamnccl's own host work, so that
// `python -m streamnccl.bench.launch` can set it beside torch's no-op `fake` backend. Nothing
// is checked or modelled here: the fake GPU (FakeGpu, RecordingCuda, RecordingNccl) is what
// the tests run the path on.

#include "cuda/CudaApi.hpp"
#include "cuda/NcclApi.hpp"

#include <atomic>
#include <cstdint>
#include <memory>

namespace streamnccl::fake {

class NoOpCuda final : public CudaApi {
 public:
  // `tensorsDevice`: the device of the group's tensors, which its streams carry.
  explicit NoOpCuda(c10::Device tensorsDevice) : tensorsDevice_(tensorsDevice) {}

  c10::DeviceType tensorsType() const override { return tensorsDevice_.type(); }
  void checkUsable(const c10::Device&) override {}
  // Always current, as CudaApi::runtime()'s is in a one-device process: nothing to scope.
  std::unique_ptr<DeviceScope> useDevice(const c10::Device&) override { return nullptr; }
  int computeCapability(const c10::Device&) override { return 90; }

  c10::Stream currentStream(const c10::Device& device) override;
  c10::Stream exchangeCurrentStream(c10::Stream stream) override;
  c10::Stream createStream(bool) override {
    return c10::Stream(c10::Stream::UNSAFE, tensorsDevice_, ++streams_);
  }
  void destroyStream(c10::Stream) override {}
  cudaStream_t native(c10::Stream stream) override {
    return reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(stream.id() + 1));
  }
  bool isCapturing(c10::Stream) override { return false; }
  cudaStreamCaptureMode exchangeCaptureMode(cudaStreamCaptureMode mode) override { return mode; }

  cudaEvent_t createEvent(bool) override {
    return reinterpret_cast<cudaEvent_t>(static_cast<intptr_t>(++events_));
  }
  void destroyEvent(cudaEvent_t) override {}
  void recordEvent(cudaEvent_t, c10::Stream) override {}
  void streamWaitEvent(c10::Stream, cudaEvent_t) override {}
  EventStatus queryEvent(cudaEvent_t) override { return EventStatus::Passed; }
  float elapsedMs(cudaEvent_t, cudaEvent_t) override { return 0.0F; }
  std::vector<c10::Device> futureDevices(const c10::Device&) override { return {}; }
  void launchKernel(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                    c10::ArrayRef<at::Tensor> inputs, int64_t scalar) override {
    kernel.run(outputs, inputs, scalar);
  }

 private:
  const c10::Device tensorsDevice_;
  std::atomic<int64_t> streams_{0};
  std::atomic<int64_t> events_{0};
};

class NoOpNccl final : public NcclApi {
 public:
  ncclResult_t getVersion(int* version) override;
  ncclResult_t getUniqueId(ncclUniqueId* id) override;
  ncclResult_t commInitRankConfig(ncclComm_t* comm, int, ncclUniqueId, int, ncclConfig_t*) override;
  ncclResult_t commShrink(ncclComm_t, int*, int, ncclComm_t* newcomm, ncclConfig_t*, int) override;
  ncclResult_t commSplit(ncclComm_t, int, int, ncclComm_t* newcomm, ncclConfig_t*) override;
  ncclResult_t commFinalize(ncclComm_t) override { return ncclSuccess; }
  ncclResult_t commDestroy(ncclComm_t) override { return ncclSuccess; }
  ncclResult_t commAbort(ncclComm_t) override { return ncclSuccess; }
  ncclResult_t commGetAsyncError(ncclComm_t, ncclResult_t* asyncError) override;
  const char* getErrorString(ncclResult_t) override { return "no-op NCCL"; }
  const char* getLastError(ncclComm_t) override { return ""; }

  ncclResult_t allReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                         cudaStream_t) override {
    return ncclSuccess;
  }
  ncclResult_t broadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                         cudaStream_t) override {
    return ncclSuccess;
  }
  ncclResult_t reduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                      cudaStream_t) override {
    return ncclSuccess;
  }
  ncclResult_t allGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                         cudaStream_t) override {
    return ncclSuccess;
  }
  ncclResult_t reduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) override {
    return ncclSuccess;
  }
  bool hasAllToAll() override { return true; }
  ncclResult_t allToAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                        cudaStream_t) override {
    return ncclSuccess;
  }
  ncclResult_t send(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) override {
    return ncclSuccess;
  }
  ncclResult_t recv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) override {
    return ncclSuccess;
  }
  ncclResult_t groupStart() override { return ncclSuccess; }
  ncclResult_t groupEnd() override { return ncclSuccess; }
  ncclResult_t redOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t, ncclScalarResidence_t,
                                    ncclComm_t) override;
  ncclResult_t redOpDestroy(ncclRedOp_t, ncclComm_t) override { return ncclSuccess; }
  // No memory of its own: the launch bench allocates none through NCCL.
  bool hasMemAlloc() override { return false; }
  ncclResult_t memAlloc(void**, size_t) override { return ncclInvalidUsage; }
  ncclResult_t memFree(void*) override { return ncclInvalidUsage; }
  ncclResult_t commRegister(ncclComm_t, void*, size_t, void** handle) override {
    *handle = nullptr;
    return ncclSuccess;
  }
  ncclResult_t commDeregister(ncclComm_t, void*) override { return ncclSuccess; }

 private:
  std::atomic<intptr_t> comms_{0};
};

}  // namespace streamnccl::fake
