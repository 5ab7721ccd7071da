#pragma once

// Test-only. NcclApi over a FakeGpu and a FakeNcclWorld. Nothing moves: each call is written to
// the GPU's log (with its counts, datatypes, reduce ops, roots, peers, communicator, stream and
// buffers) and checked as NCCL and the GPU would check it:
//   - init meets the other ranks in the world; a blocking one waits for them, a non-blocking
//     one returns ncclInProgress until they have all joined;
//   - a call on a non-blocking communicator whose last operation is still in progress fails,
//     as NCCL fails it ("use the communicator only once ncclCommGetAsyncError says success");
//   - a call on an aborted or destroyed communicator is a use after free;
//   - each call runs on its communicator's device, on the thread's current stream, and its
//     buffers (and a device PreMulSum factor) must be held until its kernel runs (FakeGpu);
//   - grouped calls are enqueued at the outermost ncclGroupEnd.
// Failures and ncclInProgress can be injected per call through the log.

#include "cuda/NcclApi.hpp"
#include "fake/FakeGpu.hpp"
#include "fake/FakeNcclWorld.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace streamnccl::fake {

class RecordingNccl final : public NcclApi {
 public:
  RecordingNccl(std::shared_ptr<FakeGpu> gpu, std::shared_ptr<FakeNcclWorld> world)
      : gpu_(std::move(gpu)), world_(std::move(world)) {}

  ncclResult_t getVersion(int* version) override;
  ncclResult_t getUniqueId(ncclUniqueId* id) override;
  ncclResult_t commInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                  ncclConfig_t* config) override;
  ncclResult_t commDestroy(ncclComm_t comm) override;
  ncclResult_t commAbort(ncclComm_t comm) override;
  // Polled by the watchdog, so not written to the log. An injected failure of
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

  // How deep the calling thread is in NCCL groups (0: none open).
  static int groupDepthOfThread();

 private:
  struct Kernel {
    StreamId stream = 0;
    std::string name;
    std::vector<Buffer> buffers;
  };
  struct Comm {
    std::string name;  // C0, C1, ...
    int device = 0;
    int nranks = 0;
    uint64_t key = 0;
    bool blocking = true;
    bool initPending = false;
    int busyPolls = 0;              // an injected ncclInProgress still being "enqueued"
    std::optional<Kernel> pending;  // its kernel, enqueued once done
    bool aborted = false;
    bool destroyed = false;
    std::map<int, Buffer> deviceScalars;  // PreMulSum ops whose factor NCCL reads at run time
  };

  // ncclSuccess, or the failure the log was asked to inject into `function`.
  ncclResult_t outcome(const char* function);
  // The communicator for a call, or null after logging why the call must fail.
  Comm* usable(ncclComm_t comm, const std::string& call);
  bool ready(Comm& comm);
  // Logs `line`, checks and issues one data call on `comm` and `stream`.
  ncclResult_t issue(const char* function, const std::string& line, ncclComm_t comm,
                     cudaStream_t stream, std::vector<Buffer> buffers,
                     std::optional<ncclRedOp_t> op, const void* send, const void* recv,
                     size_t bytes);

  const std::shared_ptr<FakeGpu> gpu_;
  const std::shared_ptr<FakeNcclWorld> world_;
  std::mutex mutex_;
  std::map<int64_t, Comm> comms_;
  int64_t commsMade_ = 0;
  int redOpsMade_ = 0;
  std::mutex errorMutex_;
  std::string lastError_;
};

}  // namespace streamnccl::fake
