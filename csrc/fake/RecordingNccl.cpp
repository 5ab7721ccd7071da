#include "fake/RecordingNccl.hpp"

#include "fake/RecordingCuda.hpp"

#include <sstream>

namespace streamnccl::fake {
namespace {

// An NCCL group belongs to the calling thread, whatever communicators its calls use.
struct GroupedKernel {
  FakeGpu* gpu;
  StreamId stream;
  std::string name;
  std::string comm;
  std::vector<Buffer> buffers;
};
thread_local int groupDepth = 0;
thread_local std::vector<GroupedKernel> grouped;

constexpr auto kBlockingInitWait = std::chrono::seconds(60);

std::string streamName(cudaStream_t stream) { return "S" + std::to_string(number(stream)); }
std::string commName(ncclComm_t comm) { return "C" + std::to_string(number(comm)); }

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
  *version = NCCL_VERSION_CODE;
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
  // NCCL_CONFIG_INITIALIZER leaves `blocking` undefined, which means blocking.
  const bool blocking = config == nullptr || config->blocking != 0;
  const std::string call = "ncclCommInitRank(nranks=" + std::to_string(nranks) +
                           ", rank=" + std::to_string(rank) + (blocking ? "" : ", nonblocking") +
                           ")";
  const ncclResult_t result = outcome("ncclCommInitRank");
  if (result != ncclSuccess) {
    gpu_->log().add(call + " failed");
    return result;  // no communicator made
  }
  const uint64_t key = FakeNcclWorld::keyOf(id);
  world_->join(key, rank, nranks);
  if (blocking && !world_->waitComplete(key, kBlockingInitWait)) {
    gpu_->log().add(call + " never met its other ranks");
    return ncclSystemError;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t number = commsMade_++;
  *comm = handle<ncclComm_t>(number);
  Comm& made = comms_[number];
  made.name = commName(*comm);
  made.device = device;
  made.nranks = nranks;
  made.key = key;
  made.blocking = blocking;
  made.initPending = !blocking;
  gpu_->log().add(call + " -> " + made.name);
  return blocking ? ncclSuccess : ncclInProgress;
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
  return !comm.initPending && !comm.pending;
}

ncclResult_t RecordingNccl::commDestroy(ncclComm_t handleValue) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string call = "ncclCommDestroy(" + commName(handleValue) + ")";
  gpu_->log().add(call);
  if (Comm* comm = usable(handleValue, call)) {
    comm->destroyed = true;
  }
  return outcome("ncclCommDestroy");
}

ncclResult_t RecordingNccl::commAbort(ncclComm_t handleValue) {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_->log().add("ncclCommAbort(" + commName(handleValue) + ")");
  auto found = comms_.find(number(handleValue));
  if (found == comms_.end() || found->second.aborted || found->second.destroyed) {
    gpu_->log().violation("ncclCommAbort(" + commName(handleValue) +
                          ") of a communicator already freed");
  } else {
    found->second.aborted = true;  // may be still initializing or busy: abort ends that
    gpu_->abortKernels(found->second.name);
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
  if (comm.initPending && world_->complete(comm.key)) {
    comm.initPending = false;
  }
  if (comm.pending) {
    if (comm.busyPolls > 0) {
      --comm.busyPolls;
    } else {  // the call in progress is done: its kernel is on the stream now
      gpu_->clearEnqueueInProgress(comm.pending->stream);
      gpu_->enqueueKernel(comm.pending->stream, comm.pending->name, comm.name,
                          comm.pending->buffers);
      comm.pending.reset();
    }
  }
  if (comm.initPending || comm.pending) {
    *asyncError = ncclInProgress;
  }
  return ncclSuccess;
}

ncclResult_t RecordingNccl::issue(const char* function, const std::string& line,
                                  ncclComm_t handleValue, cudaStream_t nativeStream,
                                  std::vector<Buffer> buffers, std::optional<ncclRedOp_t> op,
                                  const void* send, const void* recv, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_->log().add(line);
  gpu_->log().addBuffers(BufferRecord{function, reinterpret_cast<uintptr_t>(send),
                                      reinterpret_cast<uintptr_t>(recv), bytes});
  Comm* comm = usable(handleValue, function);
  if (comm == nullptr) {
    return ncclInvalidArgument;
  }
  const StreamId stream = number(nativeStream);
  gpu_->checkCallContext(function, comm->device, stream);
  if (op) {
    if (auto scalar = comm->deviceScalars.find(static_cast<int>(*op));
        scalar != comm->deviceScalars.end()) {
      buffers.push_back(scalar->second);
    }
  }
  if (const ncclResult_t injected = outcome(function); injected != ncclSuccess) {
    return injected;
  }
  if (groupDepth > 0) {
    grouped.push_back(GroupedKernel{gpu_.get(), stream, function, comm->name, std::move(buffers)});
    return ncclSuccess;
  }
  if (const int polls = gpu_->log().takeInProgress(function); polls > 0) {
    comm->busyPolls = polls;
    comm->pending = Kernel{stream, function, std::move(buffers)};
    gpu_->markEnqueueInProgress(stream, function);
    return ncclInProgress;
  }
  gpu_->enqueueKernel(stream, function, comm->name, std::move(buffers));
  return ncclSuccess;
}

ncclResult_t RecordingNccl::allReduce(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
  return issue("ncclAllReduce",
               "ncclAllReduce(count=" + std::to_string(count) + ", " + typeName(datatype) + ", " +
                   opName(op) + ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")}, op,
               sendbuff, recvbuff, count * sizeOf(datatype));
}

ncclResult_t RecordingNccl::broadcast(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  return issue("ncclBroadcast",
               "ncclBroadcast(count=" + std::to_string(count) + ", " + typeName(datatype) +
                   ", root=" + std::to_string(root) + ", " + commName(comm) + ", " +
                   streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               std::nullopt, sendbuff, recvbuff, count * sizeOf(datatype));
}

ncclResult_t RecordingNccl::reduce(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  return issue("ncclReduce",
               "ncclReduce(count=" + std::to_string(count) + ", " + typeName(datatype) + ", " +
                   opName(op) + ", root=" + std::to_string(root) + ", " + commName(comm) + ", " +
                   streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")}, op,
               sendbuff, recvbuff, count * sizeOf(datatype));
}

ncclResult_t RecordingNccl::allGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm,
                                      cudaStream_t stream) {
  return issue("ncclAllGather",
               "ncclAllGather(sendcount=" + std::to_string(sendcount) + ", " + typeName(datatype) +
                   ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")},
               std::nullopt, sendbuff, recvbuff, sendcount * sizeOf(datatype));
}

ncclResult_t RecordingNccl::reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
  return issue("ncclReduceScatter",
               "ncclReduceScatter(recvcount=" + std::to_string(recvcount) + ", " +
                   typeName(datatype) + ", " + opName(op) + ", " + commName(comm) + ", " +
                   streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send"), gpu_->buffer(recvbuff, "recv")}, op,
               sendbuff, recvbuff, recvcount * sizeOf(datatype));
}

ncclResult_t RecordingNccl::send(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                 int peer, ncclComm_t comm, cudaStream_t stream) {
  return issue("ncclSend",
               "ncclSend(count=" + std::to_string(count) + ", " + typeName(datatype) + ", peer=" +
                   std::to_string(peer) + ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(sendbuff, "send")}, std::nullopt, sendbuff, nullptr,
               count * sizeOf(datatype));
}

ncclResult_t RecordingNccl::recv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
  return issue("ncclRecv",
               "ncclRecv(count=" + std::to_string(count) + ", " + typeName(datatype) + ", peer=" +
                   std::to_string(peer) + ", " + commName(comm) + ", " + streamName(stream) + ")",
               comm, stream, {gpu_->buffer(recvbuff, "recv")}, std::nullopt, nullptr, recvbuff,
               count * sizeOf(datatype));
}

ncclResult_t RecordingNccl::groupStart() {
  gpu_->log().add("ncclGroupStart()");
  ++groupDepth;
  return outcome("ncclGroupStart");
}

ncclResult_t RecordingNccl::groupEnd() {
  gpu_->log().add("ncclGroupEnd()");
  if (groupDepth > 0 && --groupDepth == 0) {
    // Only now does NCCL read the grouped calls' buffers and enqueue their kernels.
    for (GroupedKernel& kernel : std::exchange(grouped, {})) {
      kernel.gpu->checkHeldUntilGroupEnd(kernel.name, kernel.buffers);
      kernel.gpu->enqueueKernel(kernel.stream, kernel.name, kernel.comm, std::move(kernel.buffers));
    }
  }
  return outcome("ncclGroupEnd");
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
    comm->deviceScalars[static_cast<int>(*op)] = gpu_->buffer(scalar, "PreMulSum factor");
  }
  return outcome("ncclRedOpCreatePreMulSum");
}

ncclResult_t RecordingNccl::redOpDestroy(ncclRedOp_t op, ncclComm_t handleValue) {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_->log().add("ncclRedOpDestroy(" + opName(op) + ", " + commName(handleValue) + ")");
  if (Comm* comm = usable(handleValue, "ncclRedOpDestroy")) {
    // NCCL allows destroying an op once the calls using it are issued: they keep its factor.
    comm->deviceScalars.erase(static_cast<int>(op));
  }
  return outcome("ncclRedOpDestroy");
}

}  // namespace streamnccl::fake
