#pragma once

// Test-only. Fakes of NcclApi and CudaApi that do nothing but write down each call, in order,
// with its counts, datatypes, reduce ops, roots, peers, communicators and streams. A group
// whose CUDA path runs on them (its "cuda" tensors are CPU tensors) lets tests check, without
// a GPU, the exact calls the NCCL path makes for every op. Handles are named by creation:
// streams S0 (the caller's) and S1.., events E1.., communicators C0.., PreMulSum ops R0..

#include "cuda/CudaApi.hpp"
#include "cuda/NcclApi.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace streamnccl::fake {

class CallLog {
 public:
  void add(std::string call);
  std::vector<std::string> calls() const;
  void clear();
  // The next call of `function` (an NCCL name, e.g. "ncclAllReduce") fails with
  // ncclInternalError, and ncclGetLastError then says so.
  void failNext(std::string function);
  bool takeFailure(const std::string& function);
  // While held, no event completes: the ops recorded since look stuck.
  void holdEvents(bool held) { eventsHeld_ = held; }
  bool eventsHeld() const { return eventsHeld_; }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> calls_;
  std::vector<std::string> failing_;
  std::atomic<bool> eventsHeld_{false};
};

class RecordingCuda final : public CudaApi {
 public:
  explicit RecordingCuda(std::shared_ptr<CallLog> log) : log_(std::move(log)) {}

  void checkUsable(const c10::Device&) override {}  // every device is simulated
  c10::Stream currentStream(const c10::Device& device) override;
  c10::Stream streamFromPool(const c10::Device& device, bool highPriority) override;
  c10::Stream exchangeCurrentStream(c10::Stream stream) override;
  cudaStream_t native(c10::Stream stream) override;

  cudaEvent_t createEvent(const c10::Device& device) override;
  void destroyEvent(const c10::Device&, cudaEvent_t) override {}
  void recordEvent(cudaEvent_t event, c10::Stream stream) override;
  void streamWaitEvent(c10::Stream stream, cudaEvent_t event) override;
  // Nothing runs, so everything has run, unless the log holds events back.
  bool queryEvent(cudaEvent_t) override { return !log_->eventsHeld(); }

 private:
  const std::shared_ptr<CallLog> log_;
  std::mutex mutex_;
  c10::StreamId streamsMade_ = 0;  // S0 is the caller's
  std::unordered_map<c10::Device, c10::Stream> current_;
  intptr_t eventsMade_ = 0;
};

class RecordingNccl final : public NcclApi {
 public:
  explicit RecordingNccl(std::shared_ptr<CallLog> log) : log_(std::move(log)) {}

  ncclResult_t getVersion(int* version) override;
  ncclResult_t getUniqueId(ncclUniqueId* id) override;
  ncclResult_t commInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                            c10::Device device) override;
  ncclResult_t commDestroy(ncclComm_t comm) override;
  ncclResult_t commAbort(ncclComm_t comm) override;
  // Polled by the watchdog, so not written to the log; an injected failure of
  // "ncclCommGetAsyncError" reports an asynchronous ncclRemoteError once.
  ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) override;
  const char* getErrorString(ncclResult_t result) override { return ncclGetErrorString(result); }
  const char* getLastError(ncclComm_t comm) override;

  ncclResult_t allReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                         cudaStream_t stream) override;
  ncclResult_t broadcast(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream) override;
  ncclResult_t reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t allGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                             cudaStream_t stream) override;
  ncclResult_t send(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t recv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t groupStart() override;
  ncclResult_t groupEnd() override;
  ncclResult_t redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                    ncclScalarResidence_t residence, ncclComm_t comm) override;
  ncclResult_t redOpDestroy(ncclRedOp_t op, ncclComm_t comm) override;

 private:
  // ncclSuccess, or the failure the log was asked to inject into `function`.
  ncclResult_t outcome(const char* function);

  const std::shared_ptr<CallLog> log_;
  std::mutex mutex_;  // the handle counters
  std::mutex errorMutex_;
  std::string lastError_;
  intptr_t commsMade_ = 0;
  int redOpsMade_ = 0;
};

}  // namespace streamnccl::fake
