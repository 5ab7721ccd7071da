#pragma once

// Test-only. NcclApi over a FakeGpu and a FakeNcclWorld. Each call is written to the GPU's log
// (with its counts, datatypes, reduce ops, roots, peers, communicator, stream and buffers) and
// checked as NCCL and the GPU would check it:
//   - init meets the other ranks in the world; a blocking one waits for them, a non-blocking
//     one returns ncclInProgress until they have all joined;
//   - a call on a non-blocking communicator whose last operation is still in progress fails,
//     as NCCL fails it ("use the communicator only once ncclCommGetAsyncError says success");
//   - a call on an aborted or destroyed communicator is a use after free;
//   - each call runs on its communicator's device, on the thread's current stream, and its
//     buffers (and a device PreMulSum factor) must be held until its kernel runs (FakeGpu);
//   - grouped calls become one kernel per communicator at the outermost ncclGroupEnd, which
//     may return ncclInProgress (a non-blocking communicator still enqueueing them);
//   - its kernels run with their peers' and move the data (FakeNcclWorld); ncclCommAbort
//     stops this member's kernels of the communicator; ncclCommFinalize and ncclCommDestroy
//     wait for them.
// Failures and ncclInProgress can be injected per call through the log.

#include "cuda/NcclApi.hpp"
#include "fake/FakeGpu.hpp"
#include "fake/FakeNcclMemory.hpp"
#include "fake/FakeNcclWorld.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace streamnccl::fake {

class RecordingNccl final : public NcclApi {
 public:
  RecordingNccl(std::shared_ptr<FakeGpu> gpu, std::shared_ptr<FakeNcclWorld> world)
      : gpu_(std::move(gpu)), world_(std::move(world)), memory_(*gpu_) {}

  ncclResult_t getVersion(int* version) override;
  ncclResult_t getUniqueId(ncclUniqueId* id) override;
  ncclResult_t commInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                  ncclConfig_t* config) override;
  // The survivors of `comm` meet in a communicator of their own, numbered anew in order; it
  // is ready once all of them have shrunk (the excluded never do). NCCL_SHRINK_ABORT first
  // stops this member's kernels of `comm`, as ncclCommAbort does, but leaves it to be freed.
  // As NCCL, a non-blocking shrink makes the new communicator on a thread tied to `comm`:
  // `*newcomm` stays null and `comm` reports ncclInProgress until it is made (or `comm` is
  // aborted, which hands out a new one that failed); only then is `*newcomm` written. With
  // shrinkShare (the config's, else NCCL_COMM_SHRINK_SHARE_RESOURCES) the new one shares
  // `comm`'s abort flag: aborting `comm` stops it too.
  // An NCCL older than 2.27 (FakeGpu::setNcclVersion) has no ncclCommShrink.
  ncclResult_t commShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                          ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) override;
  // Every member of `comm` takes part (FakeNcclWorld::joinSplit); those of one color meet in
  // a communicator of their own, ranked by key. As NCCL, a non-blocking split makes it on a
  // thread tied to `comm` (busy meanwhile: ncclInProgress) and writes `*newcomm` once it is
  // ready, which is once every member of `comm` has split and every member of the new one
  // has seen that; with NCCL_SPLIT_NOCOLOR nothing is written, once every member has split.
  // With splitShare (the config's, else NCCL_COMM_SPLIT_SHARE_RESOURCES) the new one shares
  // `comm`'s abort flag.
  ncclResult_t commSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                         ncclConfig_t* config) override;
  ncclResult_t commFinalize(ncclComm_t comm) override;
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
  // An NCCL older than 2.28 has no ncclAlltoAll; as NCCL's, it has no in-place form, so
  // buffers that overlap are a violation.
  bool hasAllToAll() override;
  ncclResult_t allToAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t send(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t recv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t groupStart() override;
  ncclResult_t groupEnd() override;
  ncclResult_t redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                    ncclScalarResidence_t residence, ncclComm_t comm) override;
  ncclResult_t redOpDestroy(ncclRedOp_t op, ncclComm_t comm) override;
  // NCCL's memory and its registration, as FakeNcclMemory models them; an NCCL older than
  // 2.19 has none of them.
  bool hasMemAlloc() override { return gpu_->ncclVersion() >= NCCL_VERSION(2, 19, 0); }
  ncclResult_t memAlloc(void** ptr, size_t size) override { return memory_.memAlloc(ptr, size); }
  ncclResult_t memFree(void* ptr) override { return memory_.memFree(ptr); }
  ncclResult_t commRegister(ncclComm_t comm, void* buff, size_t size, void** handle) override;
  ncclResult_t commDeregister(ncclComm_t comm, void* handle) override;

  // How deep the calling thread is in NCCL groups (0: none open).
  static int groupDepthOfThread();

 private:
  // Kernels a call in progress (ncclInProgress) enqueues once it is done.
  struct Pending {
    StreamId stream = 0;
    std::shared_ptr<NcclLaunch> launch;
    std::vector<Buffer> buffers;
    // The thread that made the call: NCCL completes and frees a call's group job in
    // ncclCommGetAsyncError without a lock, so only one thread may poll it.
    std::thread::id caller = std::this_thread::get_id();
  };
  struct Comm {
    std::string name;  // C0, C1, ...
    int device = 0;
    int nranks = 0;
    int rank = 0;
    uint64_t key = 0;
    bool blocking = true;
    bool initPending = false;
    int busyPolls = 0;             // an injected ncclInProgress still being "enqueued"
    std::vector<Pending> pending;  // its kernels, enqueued once done
    bool aborted = false;
    bool destroyed = false;
    int shrinks = 0;            // made from it so far: the n-th of each survivor meet
    bool shrinksShare = false;  // its config's (or the environment's) shrinkShare
    int splits = 0;             // ncclCommSplit calls on it so far: the n-th of each member meet
    bool splitsShare = false;   // its config's (or the environment's) splitShare
    // A non-blocking shrink or split of it that NCCL is still making: where the new one goes,
    // and what it will be.
    struct Shrinking {
      ncclComm_t* into = nullptr;
      int64_t number = 0;
      int64_t parent = 0;  // the shrunk one's number
      uint64_t key = 0;
      int rank = 0;
      int nranks = 0;
      bool sharesAbortFlag = false;
      bool childShrinksShare = false;
      bool childSplitsShare = false;
      // A split whose members have not all taken part yet (its key, rank and size are not
      // known until they have): which split of the parent; -1 once known, or for a shrink.
      int splitNth = -1;
      bool noColor = false;  // a split that makes nothing here
    };
    std::optional<Shrinking> shrinking;
    int64_t abortFlagOf = -1;  // the communicator whose abort flag it shares
    // The communicator a shrink or split of this one is making, or made and failed: NCCL links
    // this one to its abort flag while making it, and unlinks it only once it is made well, so
    // this one's abort writes that flag (-1: none).
    int64_t childAbortFlag = -1;
    ncclResult_t asyncFailure = ncclSuccess;  // made by a shrink its parent's abort ended,
                                              // or stopped through a shared abort flag
    bool finalizing = false;
    // PreMulSum ops made on it: a host factor read at creation, or a device factor read by
    // the kernel when it runs.
    std::map<int, double> hostFactors;
    std::map<int, Buffer> deviceFactors;
  };

  // The communicator a registration call names, as FakeNcclMemory sees it; `usableNow` false
  // (and the call logged as failing) where it cannot be used.
  FakeNcclMemory::Comm memoryComm(ncclComm_t comm, const std::string& call, bool& usableNow);
  // ncclSuccess, or the failure the log was asked to inject into `function`.
  ncclResult_t outcome(const char* function);
  // Whether `op`'s buffers lie within their allocations, as NCCL reads and writes them (its
  // counts, times the members for an all-gather's output and a reduce-scatter's input).
  void checkExtents(const char* function, const Comm& comm, NcclOp& op);
  // How many polls an injected ncclInProgress of `function` lasts (0: none asked, or the
  // model is off).
  int takeInProgress(const char* function);
  // Whether a call on `comm` is still being enqueued when it returns (ncclInProgress): on a
  // non-blocking communicator NCCL 2.28 turns every call into a group job, which
  // ncclCommGetAsyncError completes (the in_progress model).
  bool returnsInProgress(const Comm& comm, int polls) const;
  // The communicator for a call, or null after logging why the call must fail.
  Comm* usable(ncclComm_t comm, const std::string& call);
  bool ready(Comm& comm);
  // The communicator a shrink or split of `comm` is made from, checked as for any call and
  // used on its device; null after logging why `call` fails. With mutex_ held.
  Comm* parentFor(ncclComm_t comm, const std::string& call);
  // Makes communicator `number` (its handle reserved already) as a member of world `key`.
  Comm& made(int64_t number, int device, int nranks, int rank, uint64_t key, bool blocking);
  // The new communicator of `parent`'s shrink in progress, written where the caller asked:
  // failed with `failure` unless that is ncclSuccess.
  void finishShrink(Comm& parent, ncclResult_t failure);
  // A split in progress on `parent` whose members have all taken part: its new one joins its
  // members (or, NCCL_SPLIT_NOCOLOR, the parent is done). False while some have not.
  // A violation where `parent` still has kernels queued or running: NCCL's split, and its
  // shrink without NCCL_SHRINK_ABORT, need its operations finished.
  void refuseOutstanding(const Comm& parent, const std::string& call);
  bool placeSplit(Comm& parent);
  // Logs `line`, checks and issues `op` on `comm` and `stream`, its buffers `buffers`.
  ncclResult_t issue(const char* function, const std::string& line, ncclComm_t comm,
                     cudaStream_t stream, std::vector<Buffer> buffers, NcclOp op);
  std::shared_ptr<NcclLaunch> launchOf(const Comm& comm, std::vector<NcclOp> ops) const;
  // At the outermost ncclGroupEnd: this communicator's grouped calls on `stream` as one kernel
  // (still being enqueued for `polls` polls where the test asked for that).
  ncclResult_t endGroup(int64_t comm, StreamId stream, std::vector<NcclOp> ops,
                        std::vector<Buffer> buffers, int polls);

  const std::shared_ptr<FakeGpu> gpu_;
  const std::shared_ptr<FakeNcclWorld> world_;
  std::mutex mutex_;
  std::map<int64_t, Comm> comms_;
  int64_t commsMade_ = 0;
  int redOpsMade_ = 0;
  std::mutex errorMutex_;
  std::string lastError_;
  FakeNcclMemory memory_;
};

}  // namespace streamnccl::fake
