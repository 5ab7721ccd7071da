#include "fake/RecordingNccl.hpp"

#include "fake/FakeCollectives.hpp"
#include "fake/FakeNcclConfig.hpp"
#include "fake/RecordingCuda.hpp"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <sstream>

namespace streamnccl::fake {
namespace {

// An NCCL group belongs to the calling thread, whatever communicators its calls use.
struct GroupedCall {
  RecordingNccl* nccl;
  int64_t comm;
  StreamId stream;
  NcclOp op;
  std::vector<Buffer> buffers;
  std::string name;
};
thread_local int groupDepth = 0;
thread_local std::vector<GroupedCall> grouped;

// How long ncclCommDestroy of a communicator with kernels queued waits for them, before the
// fake says it would wait forever.
constexpr auto kDestroyWait = std::chrono::seconds(5);

std::string streamName(cudaStream_t stream) { return "S" + std::to_string(number(stream)); }

std::string typeName(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return "ncclInt8";
    case ncclUint8:
      return "ncclUint8";
    case ncclInt32:
      return "ncclInt32";
    case ncclUint32:
      return "ncclUint32";
    case ncclInt64:
      return "ncclInt64";
    case ncclUint64:
      return "ncclUint64";
    case ncclFloat16:
      return "ncclFloat16";
    case ncclFloat32:
      return "ncclFloat32";
    case ncclFloat64:
      return "ncclFloat64";
    case ncclBfloat16:
      return "ncclBfloat16";
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ncclFloat8e4m3:
      return "ncclFloat8e4m3";
    case ncclFloat8e5m2:
      return "ncclFloat8e5m2";
#endif
    default:
      return "ncclDataType(" + std::to_string(static_cast<int>(type)) + ")";
  }
}

size_t sizeOf(ncclDataType_t type) {
  switch (type) {
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 1;
  }
}

std::string opName(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return "ncclSum";
    case ncclProd:
      return "ncclProd";
    case ncclMax:
      return "ncclMax";
    case ncclMin:
      return "ncclMin";
    case ncclAvg:
      return "ncclAvg";
    default:
      return "R" + std::to_string(static_cast<int>(op) - static_cast<int>(ncclNumOps));
  }
}

std::string scalarText(const void* scalar, ncclDataType_t type, ncclScalarResidence_t residence) {
  if (residence != ncclScalarHostImmediate) {
    return "device";
  }
  std::ostringstream text;
  if (type == ncclFloat32) {
    text << *static_cast<const float*>(scalar);
  } else if (type == ncclFloat64) {
    text << *static_cast<const double*>(scalar);
  } else {
    text << "host";
  }
  return text.str();
}

}  // namespace

int RecordingNccl::groupDepthOfThread() { return groupDepth; }

void RecordingNccl::checkExtents(const char* function, const Comm& comm, NcclOp& op) {
  const size_t each = op.count * sizeOf(op.type);
  const size_t all = each * static_cast<size_t>(comm.nranks);
  const bool allToAll = op.kind == NcclOp::Kind::AllToAll;
  if (allToAll && all > 0) {
    // NCCL reads one whole buffer while it writes the other: it has no in-place all-to-all.
    const auto send = reinterpret_cast<uintptr_t>(op.send);
    const auto recv = reinterpret_cast<uintptr_t>(op.recv);
    if (send < recv + all && recv < send + all) {
      gpu_->log().violation(std::string(function) +
                            "'s recv buffer overlaps its send buffer (NCCL has no in-place form)");
    }
  }
  if (!gpu_->models().memory) {
    return;
  }
  const size_t sendBytes = op.kind == NcclOp::Kind::ReduceScatter || allToAll ? all : each;
  const size_t recvBytes = op.kind == NcclOp::Kind::AllGather || allToAll ? all : each;
  auto check = [&](const void* pointer, size_t bytes, const char* role) {
    if (pointer == nullptr || bytes == 0) {
      return;
    }
    const auto block = FakeMemory::instance().lookup(pointer);
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    if (block.tracked && address + bytes > block.start + block.size) {
      gpu_->log().violation(std::string(function) + "'s " + role + " buffer runs " +
                            std::to_string(address + bytes - block.start - block.size) +
                            " bytes past the end of its allocation");
      op.outOfBounds = true;  // it must not touch memory it does not own
    }
  };
  check(op.send, sendBytes, "send");
  check(op.recv, recvBytes, "recv");
}

int RecordingNccl::takeInProgress(const char* function) {
  const int polls = gpu_->log().takeInProgress(function);
  return gpu_->models().inProgress ? polls : 0;
}

bool RecordingNccl::returnsInProgress(const Comm& comm, int polls) const {
  return polls > 0 || (!comm.blocking && gpu_->models().inProgress);
}

ncclResult_t RecordingNccl::outcome(const char* function) {
  if (!gpu_->log().takeFailure(function)) {
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lock(errorMutex_);
  lastError_ = std::string("injected failure of ") + function;
  return ncclInternalError;
}

const char* RecordingNccl::getLastError(ncclComm_t /*comm*/) {
  std::lock_guard<std::mutex> lock(errorMutex_);
  return lastError_.c_str();
}

ncclResult_t RecordingNccl::getVersion(int* version) {
  *version = gpu_->ncclVersion();
  return ncclSuccess;
}

ncclResult_t RecordingNccl::getUniqueId(ncclUniqueId* id) {
  *id = world_->newId();
  gpu_->log().add("ncclGetUniqueId()");
  return outcome("ncclGetUniqueId");
}

ncclResult_t RecordingNccl::commInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                               int rank, ncclConfig_t* config) {
  gpu_->bindDevice();
  const int device = FakeGpu::currentDevice();
  const bool blocking = blocksWith(config);
  const std::string call = "ncclCommInitRank(nranks=" + std::to_string(nranks) +
                           ", rank=" + std::to_string(rank) + (blocking ? "" : ", nonblocking") +
                           configText(config) + ")";
  if (const std::string refusal = configRefusal(config); !refusal.empty()) {
    gpu_->log().add(call + " failed: NCCL refuses the config (" + refusal + ")");
    return ncclInvalidArgument;
  }
  const ncclResult_t result = outcome("ncclCommInitRank");
  if (result != ncclSuccess) {
    gpu_->log().add(call + " failed");
    return result;  // no communicator made
  }
  const uint64_t key = FakeNcclWorld::keyOf(id);
  world_->join(key, rank, nranks, gpu_.get());
  if (blocking && !world_->waitComplete(key, kBlockingInitWait)) {
    gpu_->log().add(call + " never met its other ranks");
    return ncclSystemError;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t number = commsMade_++;
  *comm = handle<ncclComm_t>(number);
  Comm& comm_made = made(number, device, nranks, rank, key, blocking);
  comm_made.initPending = !blocking;
  comm_made.shrinksShare = shrinksShareWith(config);
  comm_made.splitsShare = splitsShareWith(config);
  gpu_->log().add(call + " -> " + comm_made.name);
  return blocking ? ncclSuccess : ncclInProgress;
}

RecordingNccl::Comm& RecordingNccl::made(int64_t number, int device, int nranks, int rank,
                                         uint64_t key, bool blocking) {
  Comm& comm = comms_[number];
  comm.name = commName(handle<ncclComm_t>(number));
  comm.device = device;
  comm.nranks = nranks;
  comm.rank = rank;
  comm.key = key;
  comm.blocking = blocking;
  return comm;
}

RecordingNccl::Comm* RecordingNccl::usable(ncclComm_t handleValue, const std::string& call) {
  auto found = comms_.find(number(handleValue));
  if (found == comms_.end()) {
    gpu_->log().violation(call + " on " + commName(handleValue) + ", which was never made");
    return nullptr;
  }
  Comm& comm = found->second;
  if (comm.aborted || comm.destroyed) {
    gpu_->log().violation(call + " on " + comm.name + " after " +
                          (comm.aborted ? "ncclCommAbort" : "ncclCommDestroy") +
                          " freed it (a use after free)");
    return nullptr;
  }
  if (comm.asyncFailure != ncclSuccess) {
    // As NCCL, which checks the communicator's asynchronous state first: not a misuse, the
    // caller learns of the failure from this.
    gpu_->log().add(call + " failed: " + comm.name + " has an asynchronous error");
    return nullptr;
  }
  if (!ready(comm)) {
    gpu_->log().violation(call + " on " + comm.name +
                          " before its previous operation returned ncclSuccess (NCCL fails it "
                          "with ncclInvalidArgument; poll ncclCommGetAsyncError first)");
    return nullptr;
  }
  return &comm;
}

bool RecordingNccl::ready(Comm& comm) {
  if (comm.initPending && world_->complete(comm.key)) {
    comm.initPending = false;
  }
  // A shrink in progress holds the parent as an operation does.
  return !comm.initPending && comm.pending.empty() && !comm.shrinking;
}

ncclResult_t RecordingNccl::commFinalize(ncclComm_t handleValue) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string call = "ncclCommFinalize(" + commName(handleValue) + ")";
  gpu_->log().add(call);
  Comm* comm = usable(handleValue, call);
  if (comm == nullptr) {
    return ncclInvalidArgument;
  }
  if (const ncclResult_t injected = outcome("ncclCommFinalize"); injected != ncclSuccess) {
    return injected;
  }
  comm->finalizing = true;  // done once its kernels are: ncclCommGetAsyncError tells
  world_->finalizing(comm->key, comm->rank);
  return comm->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t RecordingNccl::commDestroy(ncclComm_t handleValue) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::string call = "ncclCommDestroy(" + commName(handleValue) + ")";
  gpu_->log().add(call);
  Comm* comm = usable(handleValue, call);
  if (comm == nullptr) {
    return outcome("ncclCommDestroy");
  }
  const uint64_t key = comm->key;
  const int rank = comm->rank;
  const bool finalizing = comm->finalizing;
  lock.unlock();
  auto busy = [&] { return gpu_->hasLaunches(key, rank) || world_->graphsHolding(key, rank) > 0; };
  if (gpu_->models().teardown && busy()) {
    if (finalizing) {
      gpu_->log().violation(call +
                            " before ncclCommFinalize had finished (poll "
                            "ncclCommGetAsyncError until ncclSuccess first)");
    }
    // Destroying finalizes first: it blocks until this member's kernels of the communicator
    // are done, which they are only once its peers' have run too, and until every CUDA graph
    // with work on it is destroyed.
    std::unique_lock<std::recursive_mutex> world(world_->mutex());
    if (!world_->waitUntil(world, kDestroyWait, [&] { return !busy(); })) {
      gpu_->log().violation(call + " waited " + std::to_string(kDestroyWait.count()) +
                            " s for the communicator's kernels or the CUDA graphs holding it, "
                            "which never went: it would block forever");
    }
  }
  lock.lock();
  comm->destroyed = true;
  memory_.released(number(handleValue));
  world_->markDestroyed(key, rank);
  return outcome("ncclCommDestroy");
}

ncclResult_t RecordingNccl::commAbort(ncclComm_t handleValue) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::string call = "ncclCommAbort(" + commName(handleValue) + ")";
  gpu_->log().add(call);
  auto found = comms_.find(number(handleValue));
  if (found == comms_.end() || found->second.aborted || found->second.destroyed) {
    gpu_->log().violation(call + " of a communicator already freed");
    return outcome("ncclCommAbort");
  }
  Comm& comm = found->second;
  if (const auto linked = comms_.find(comm.childAbortFlag);
      linked != comms_.end() && (linked->second.aborted || linked->second.destroyed) &&
      gpu_->models().shrink) {
    gpu_->log().violation(call + " writes the abort flag of " + linked->second.name +
                          ", which failed to be made from it and was freed before this abort "
                          "(a use after free: abort the parent before freeing a failed child)");
  }
  comm.childAbortFlag = -1;
  // First the abort flag: this member's kernels of the communicator quit, even those a
  // graph replays.
  comm.aborted = true;  // may be still initializing or busy: abort ends that
  memory_.released(found->first);
  for (const Pending& pending : comm.pending) {
    gpu_->clearEnqueueInProgress(pending.stream);
  }
  comm.pending.clear();
  gpu_->stopLaunches(comm.key, comm.rank);
  if (comm.shrinking && comm.shrinking->noColor) {
    comm.shrinking.reset();  // a split that makes nothing here: NCCL's thread just quits
  } else if (comm.shrinking) {
    // NCCL joins the thread making a shrunk or split communicator, which quits on the abort
    // flag and hands out the new communicator, failed.
    finishShrink(comm, ncclInternalError);
  }
  const int64_t aborted = number(handleValue);
  for (auto& [childNumber, child] : comms_) {
    if (child.abortFlagOf == aborted && !child.aborted && !child.destroyed &&
        gpu_->models().shrink) {
      // It shares this one's abort flag: its kernels quit too, and it is unusable.
      gpu_->log().add("ncclCommAbort(" + comm.name + ") stops " + child.name +
                      ", which shares its abort flag");
      gpu_->stopLaunches(child.key, child.rank);
      child.asyncFailure = ncclInternalError;
    }
  }
  const uint64_t key = comm.key;
  const int rank = comm.rank;
  lock.unlock();
  if (gpu_->models().teardown && world_->graphsHolding(key, rank) > 0) {
    // Then, as at destroy, NCCL frees the communicator only once every CUDA graph with work
    // on it is destroyed: the call blocks until then.
    std::unique_lock<std::recursive_mutex> world(world_->mutex());
    if (!world_->waitUntil(world, kDestroyWait,
                           [&] { return world_->graphsHolding(key, rank) == 0; })) {
      gpu_->log().violation(call + " waited " + std::to_string(kDestroyWait.count()) +
                            " s for the CUDA graphs holding the communicator, which never "
                            "went: it would block its caller forever");
    }
  }
  return outcome("ncclCommAbort");
}

ncclResult_t RecordingNccl::commGetAsyncError(ncclComm_t handleValue, ncclResult_t* asyncError) {
  std::lock_guard<std::mutex> lock(mutex_);
  *asyncError = ncclSuccess;
  auto found = comms_.find(number(handleValue));
  if (found == comms_.end() || found->second.aborted || found->second.destroyed) {
    gpu_->log().violation("ncclCommGetAsyncError(" + commName(handleValue) +
                          ") of a communicator already freed (a use after free)");
    return ncclInvalidArgument;
  }
  Comm& comm = found->second;
  if (gpu_->log().takeFailure("ncclCommGetAsyncError")) {
    std::lock_guard<std::mutex> errorLock(errorMutex_);
    lastError_ = "injected asynchronous error";
    *asyncError = ncclRemoteError;
    return ncclSuccess;
  }
  // First: a new one whose making failed is reported on this one.
  if (comm.shrinking && !gpu_->shrinksHeld() && placeSplit(comm) && comm.shrinking &&
      world_->complete(comm.shrinking->key)) {
    // fail_next("making a communicator"): NCCL's thread fails to make this one.
    finishShrink(comm,
                 gpu_->log().takeFailure("making a communicator") ? ncclSystemError : ncclSuccess);
  }
  if (comm.asyncFailure != ncclSuccess) {
    std::lock_guard<std::mutex> errorLock(errorMutex_);
    lastError_ = comm.name +
                 " has an asynchronous error (one being made from it failed, or its "
                 "parent's abort ended its making, or one sharing its abort flag was aborted)";
    *asyncError = comm.asyncFailure;
    return ncclSuccess;
  }
  if (comm.initPending && world_->complete(comm.key)) {
    comm.initPending = false;
  }
  if (!comm.pending.empty() && comm.pending.front().caller != std::this_thread::get_id() &&
      gpu_->models().inProgress) {
    gpu_->log().violation("ncclCommGetAsyncError(" + comm.name +
                          ") on a second thread while a call made on another thread is still "
                          "being enqueued: NCCL completes and frees that call's group job here "
                          "without a lock, so two pollers may complete it twice or after it is "
                          "freed");
  }
  if (!comm.pending.empty()) {
    if (comm.busyPolls > 0) {
      --comm.busyPolls;
    } else {  // the calls in progress are done: their kernels are on their streams now
      for (Pending& pending : std::exchange(comm.pending, {})) {
        gpu_->clearEnqueueInProgress(pending.stream);
        gpu_->launchNccl(pending.stream, std::move(pending.launch), std::move(pending.buffers));
      }
    }
  }
  bool flushing = false;
  if (comm.finalizing && gpu_->models().teardown) {
    if (!gpu_->models().progress) {
      world_->advance();
    }
    // Its kernels, every member's finalize (a node's members finalize together), and the
    // CUDA graphs with work on it.
    flushing = gpu_->hasLaunches(comm.key, comm.rank) || !world_->allFinalizing(comm.key) ||
               world_->graphsHolding(comm.key, comm.rank) > 0;
  }
  if (comm.initPending || !comm.pending.empty() || flushing || comm.shrinking) {
    *asyncError = ncclInProgress;
  }
  return ncclSuccess;
}

std::shared_ptr<NcclLaunch> RecordingNccl::launchOf(const Comm& comm,
                                                    std::vector<NcclOp> ops) const {
  auto launch = std::make_shared<NcclLaunch>();
  launch->comm = comm.key;
  launch->commName = comm.name;
  launch->rank = comm.rank;
  launch->nranks = comm.nranks;
  launch->ops = std::move(ops);
  return launch;
}

ncclResult_t RecordingNccl::issue(const char* function, const std::string& line,
                                  ncclComm_t handleValue, cudaStream_t nativeStream,
                                  std::vector<Buffer> buffers, NcclOp op) {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_->log().add(line);
  gpu_->log().addBuffers(BufferRecord{function, reinterpret_cast<uintptr_t>(op.send),
                                      reinterpret_cast<uintptr_t>(op.recv),
                                      op.count * sizeOf(op.type)});
  Comm* comm = usable(handleValue, function);
  if (comm == nullptr) {
    return ncclInvalidArgument;
  }
  const StreamId stream = number(nativeStream);
  gpu_->checkCallContext(function, comm->device, stream);
  checkExtents(function, *comm, op);
  const int redOp = static_cast<int>(op.op);
  if (auto factor = comm->hostFactors.find(redOp); factor != comm->hostFactors.end()) {
    op.hostFactor = factor->second;
  }
  if (auto factor = comm->deviceFactors.find(redOp); factor != comm->deviceFactors.end()) {
    op.deviceFactor = factor->second.pointer;
    buffers.push_back(factor->second);
  }
  if (const ncclResult_t injected = outcome(function); injected != ncclSuccess) {
    return injected;
  }
  if (groupDepth > 0) {
    grouped.push_back(
        GroupedCall{this, number(handleValue), stream, op, std::move(buffers), function});
    return ncclSuccess;
  }
  auto launch = launchOf(*comm, {op});
  if (const int polls = takeInProgress(function); returnsInProgress(*comm, polls)) {
    if (polls > 0) {  // asked for by the test: logged, for it to see
      gpu_->log().add(std::string(function) + " -> ncclInProgress");
    }
    comm->busyPolls = polls;
    comm->pending.push_back(Pending{stream, std::move(launch), std::move(buffers)});
    gpu_->markEnqueueInProgress(stream, function);
    return ncclInProgress;
  }
  gpu_->launchNccl(stream, std::move(launch), std::move(buffers));
  return ncclSuccess;
}

namespace {

NcclOp opOf(NcclOp::Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type,
            ncclRedOp_t op = ncclSum, int rootOrPeer = 0) {
  NcclOp made;
  made.kind = kind;
  made.send = send;
  made.recv = recv;
  made.count = count;
  made.type = type;
  made.op = op;
  made.root = rootOrPeer;
  return made;
}

}  // namespace

ncclResult_t RecordingNccl::allReduce(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
  return issue("ncclAllReduce",
               "ncclAllReduce(count=" + std::to_string(count) + ", " + typeName(datatype) + ", " +
                   opName(op) + ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               opOf(NcclOp::Kind::AllReduce, sendbuff, recvbuff, count, datatype, op));
}

ncclResult_t RecordingNccl::broadcast(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  return issue("ncclBroadcast",
               "ncclBroadcast(count=" + std::to_string(count) + ", " + typeName(datatype) +
                   ", root=" + std::to_string(root) + ", " + commName(comm) + ", " +
                   streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               opOf(NcclOp::Kind::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root));
}

ncclResult_t RecordingNccl::reduce(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  return issue("ncclReduce",
               "ncclReduce(count=" + std::to_string(count) + ", " + typeName(datatype) + ", " +
                   opName(op) + ", root=" + std::to_string(root) + ", " + commName(comm) + ", " +
                   streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               opOf(NcclOp::Kind::Reduce, sendbuff, recvbuff, count, datatype, op, root));
}

ncclResult_t RecordingNccl::allGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm,
                                      cudaStream_t stream) {
  return issue("ncclAllGather",
               "ncclAllGather(sendcount=" + std::to_string(sendcount) + ", " + typeName(datatype) +
                   ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               opOf(NcclOp::Kind::AllGather, sendbuff, recvbuff, sendcount, datatype));
}

ncclResult_t RecordingNccl::reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
  return issue("ncclReduceScatter",
               "ncclReduceScatter(recvcount=" + std::to_string(recvcount) + ", " +
                   typeName(datatype) + ", " + opName(op) + ", " + commName(comm) + ", " +
                   streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               opOf(NcclOp::Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op));
}

bool RecordingNccl::hasAllToAll() { return gpu_->ncclVersion() >= NCCL_VERSION(2, 28, 0); }

ncclResult_t RecordingNccl::allToAll(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
  const std::string call = "ncclAlltoAll(count=" + std::to_string(count) + ", " +
                           typeName(datatype) + ", " + commName(comm) + ", " + streamName(stream) +
                           ")";
  if (!hasAllToAll()) {
    gpu_->log().violation(call + " with NCCL " + std::to_string(gpu_->ncclVersion()) +
                          ", which has no ncclAlltoAll (2.28+)");
    return ncclInvalidUsage;
  }
  return issue("ncclAlltoAll", call, comm, stream,
               {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               opOf(NcclOp::Kind::AllToAll, sendbuff, recvbuff, count, datatype));
}

ncclResult_t RecordingNccl::send(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                 int peer, ncclComm_t comm, cudaStream_t stream) {
  return issue("ncclSend",
               "ncclSend(count=" + std::to_string(count) + ", " + typeName(datatype) + ", peer=" +
                   std::to_string(peer) + ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send")},
               opOf(NcclOp::Kind::Send, sendbuff, nullptr, count, datatype, ncclSum, peer));
}

ncclResult_t RecordingNccl::recv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
  return issue("ncclRecv",
               "ncclRecv(count=" + std::to_string(count) + ", " + typeName(datatype) + ", peer=" +
                   std::to_string(peer) + ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(recvbuff, "recv")},
               opOf(NcclOp::Kind::Recv, nullptr, recvbuff, count, datatype, ncclSum, peer));
}

ncclResult_t RecordingNccl::groupStart() {
  gpu_->log().add("ncclGroupStart()");
  ++groupDepth;
  return outcome("ncclGroupStart");
}

ncclResult_t RecordingNccl::groupEnd() {
  gpu_->log().add("ncclGroupEnd()");
  if (groupDepth == 0 || --groupDepth > 0) {
    return outcome("ncclGroupEnd");
  }
  // Only now does NCCL read the grouped calls' buffers and enqueue their kernels: one per
  // communicator and stream, in the order their first call was made.
  const int polls = takeInProgress("ncclGroupEnd");
  std::vector<std::tuple<RecordingNccl*, int64_t, StreamId>> order;
  std::map<std::tuple<RecordingNccl*, int64_t, StreamId>,
           std::pair<std::vector<NcclOp>, std::vector<Buffer>>>
      kernels;
  for (GroupedCall& call : std::exchange(grouped, {})) {
    call.nccl->gpu_->checkHeldUntilGroupEnd(call.name, call.buffers);
    const auto key = std::make_tuple(call.nccl, call.comm, call.stream);
    auto& [ops, buffers] = kernels[key];
    if (ops.empty()) {
      order.push_back(key);
    }
    ops.push_back(call.op);
    buffers.insert(buffers.end(), call.buffers.begin(), call.buffers.end());
  }
  ncclResult_t result = ncclSuccess;
  for (const auto& key : order) {
    auto& [ops, buffers] = kernels[key];
    const ncclResult_t ended = std::get<0>(key)->endGroup(
        std::get<1>(key), std::get<2>(key), std::move(ops), std::move(buffers), polls);
    if (ended != ncclSuccess) {
      result = ended;
    }
  }
  const ncclResult_t injected = outcome("ncclGroupEnd");
  return injected != ncclSuccess ? injected : result;
}

ncclResult_t RecordingNccl::endGroup(int64_t commNumber, StreamId stream, std::vector<NcclOp> ops,
                                     std::vector<Buffer> buffers, int polls) {
  std::lock_guard<std::mutex> lock(mutex_);
  Comm& comm = comms_.at(commNumber);
  auto launch = launchOf(comm, std::move(ops));
  if (returnsInProgress(comm, polls)) {
    // A non-blocking communicator still enqueueing the group: its kernels are on the stream
    // only once ncclCommGetAsyncError says so.
    if (polls > 0) {
      gpu_->log().add("ncclGroupEnd() -> ncclInProgress on " + comm.name);
    }
    comm.busyPolls = polls;
    comm.pending.push_back(Pending{stream, std::move(launch), std::move(buffers)});
    gpu_->markEnqueueInProgress(stream, "ncclGroupEnd");
    return ncclInProgress;
  }
  gpu_->launchNccl(stream, std::move(launch), std::move(buffers));
  return ncclSuccess;
}

ncclResult_t RecordingNccl::redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                 ncclDataType_t datatype,
                                                 ncclScalarResidence_t residence,
                                                 ncclComm_t handleValue) {
  std::lock_guard<std::mutex> lock(mutex_);
  *op = static_cast<ncclRedOp_t>(static_cast<int>(ncclNumOps) + redOpsMade_++);
  gpu_->log().add("ncclRedOpCreatePreMulSum(scalar=" + scalarText(scalar, datatype, residence) +
                  ", " + typeName(datatype) + ", " + commName(handleValue) + ") -> " + opName(*op));
  Comm* comm = usable(handleValue, "ncclRedOpCreatePreMulSum");
  if (comm == nullptr) {
    return ncclInvalidArgument;
  }
  if (residence == ncclScalarDevice) {
    // Read by the reduction's kernel when it runs, not now.
    comm->deviceFactors[static_cast<int>(*op)] = gpu_->buffer(scalar, "PreMulSum factor");
  } else {
    // Read now, from the host.
    FakeMemory::Untracked fakesOwn;
    comm->hostFactors[static_cast<int>(*op)] =
        at::from_blob(scalar, {1}, at::TensorOptions().dtype(scalarTypeOf(datatype)))
            .to(at::kDouble)
            .item<double>();
  }
  return outcome("ncclRedOpCreatePreMulSum");
}

ncclResult_t RecordingNccl::redOpDestroy(ncclRedOp_t op, ncclComm_t handleValue) {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_->log().add("ncclRedOpDestroy(" + opName(op) + ", " + commName(handleValue) + ")");
  if (Comm* comm = usable(handleValue, "ncclRedOpDestroy")) {
    // NCCL allows destroying an op once the calls using it are issued: they keep its factor.
    comm->deviceFactors.erase(static_cast<int>(op));
    comm->hostFactors.erase(static_cast<int>(op));
  }
  return outcome("ncclRedOpDestroy");
}

}  // namespace streamnccl::fake

namespace streamnccl::fake {

// Not under mutex_: deregistration looks at the GPU's queued kernels, under the world's lock.
FakeNcclMemory::Comm RecordingNccl::memoryComm(ncclComm_t handleValue, const std::string& call,
                                               bool& usableNow) {
  std::lock_guard<std::mutex> lock(mutex_);
  Comm* comm = usable(handleValue, call);
  usableNow = comm != nullptr;
  return usableNow ? FakeNcclMemory::Comm{number(handleValue), comm->name, comm->key, comm->rank}
                   : FakeNcclMemory::Comm{};
}

ncclResult_t RecordingNccl::commRegister(ncclComm_t handleValue, void* buff, size_t size,
                                         void** handle) {
  bool usableNow = false;
  auto comm = memoryComm(handleValue, "ncclCommRegister(" + commName(handleValue) + ")", usableNow);
  return usableNow ? memory_.commRegister(comm, buff, size, handle) : ncclInvalidArgument;
}

ncclResult_t RecordingNccl::commDeregister(ncclComm_t handleValue, void* handle) {
  bool usableNow = false;
  auto comm =
      memoryComm(handleValue, "ncclCommDeregister(" + commName(handleValue) + ")", usableNow);
  return usableNow ? memory_.commDeregister(comm, handle) : ncclInvalidArgument;
}

}  // namespace streamnccl::fake
