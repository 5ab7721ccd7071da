#include "fake/Recording.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace streamnccl::fake {
namespace {

// Fake handles are small integers cast to the library's pointer types; 0 stays null.
template <typename Handle>
Handle handle(intptr_t number) {
  return reinterpret_cast<Handle>(number + 1);
}
template <typename Handle>
intptr_t number(Handle value) {
  return reinterpret_cast<intptr_t>(value) - 1;
}

std::string streamName(cudaStream_t stream) { return "S" + std::to_string(number(stream)); }
std::string eventName(cudaEvent_t event) { return "E" + std::to_string(number(event)); }
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

void CallLog::failNext(std::string function) {
  std::lock_guard<std::mutex> lock(mutex_);
  failing_.push_back(std::move(function));
}

bool CallLog::takeFailure(const std::string& function) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = std::find(failing_.begin(), failing_.end(), function);
  if (found == failing_.end()) {
    return false;
  }
  failing_.erase(found);
  return true;
}

void CallLog::add(std::string call) {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.push_back(std::move(call));
}

std::vector<std::string> CallLog::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

void CallLog::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.clear();
}

c10::Stream RecordingCuda::currentStream(const c10::Device& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = current_.find(device);
  return found != current_.end() ? found->second
                                 : c10::Stream(c10::Stream::UNSAFE, device, /*S0*/ 0);
}

c10::Stream RecordingCuda::streamFromPool(const c10::Device& device, bool highPriority) {
  std::lock_guard<std::mutex> lock(mutex_);
  const c10::StreamId id = ++streamsMade_;
  log_->add("getStreamFromPool(highPriority=" + std::to_string(highPriority) + ") -> S" +
            std::to_string(id));
  return c10::Stream(c10::Stream::UNSAFE, device, id);
}

c10::Stream RecordingCuda::exchangeCurrentStream(c10::Stream stream) {
  const c10::Stream previous = currentStream(stream.device());
  std::lock_guard<std::mutex> lock(mutex_);
  current_.insert_or_assign(stream.device(), stream);
  return previous;
}

cudaStream_t RecordingCuda::native(c10::Stream stream) {
  return handle<cudaStream_t>(static_cast<intptr_t>(stream.id()));
}

cudaEvent_t RecordingCuda::createEvent(const c10::Device&) {
  std::lock_guard<std::mutex> lock(mutex_);
  cudaEvent_t event = handle<cudaEvent_t>(++eventsMade_);
  log_->add("cudaEventCreate() -> " + eventName(event));
  return event;
}

void RecordingCuda::recordEvent(cudaEvent_t event, c10::Stream stream) {
  log_->add("cudaEventRecord(" + eventName(event) + ", " + streamName(native(stream)) + ")");
}

void RecordingCuda::streamWaitEvent(c10::Stream stream, cudaEvent_t event) {
  log_->add("cudaStreamWaitEvent(" + streamName(native(stream)) + ", " + eventName(event) + ")");
}

ncclResult_t RecordingNccl::outcome(const char* function) {
  if (!log_->takeFailure(function)) {
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
  *id = ncclUniqueId{};
  log_->add("ncclGetUniqueId()");
  return outcome("ncclGetUniqueId");
}

ncclResult_t RecordingNccl::commInitRank(ncclComm_t* comm, int nranks, ncclUniqueId /*id*/,
                                         int rank, c10::Device /*device*/) {
  const std::string call =
      "ncclCommInitRank(nranks=" + std::to_string(nranks) + ", rank=" + std::to_string(rank) + ")";
  const ncclResult_t result = outcome("ncclCommInitRank");
  if (result != ncclSuccess) {
    log_->add(call + " failed");
    return result;  // no communicator made
  }
  std::lock_guard<std::mutex> lock(mutex_);
  *comm = handle<ncclComm_t>(commsMade_++);
  log_->add(call + " -> " + commName(*comm));
  return ncclSuccess;
}

ncclResult_t RecordingNccl::commDestroy(ncclComm_t comm) {
  log_->add("ncclCommDestroy(" + commName(comm) + ")");
  return outcome("ncclCommDestroy");
}

ncclResult_t RecordingNccl::commAbort(ncclComm_t comm) {
  log_->add("ncclCommAbort(" + commName(comm) + ")");
  return outcome("ncclCommAbort");
}

ncclResult_t RecordingNccl::commGetAsyncError(ncclComm_t /*comm*/, ncclResult_t* asyncError) {
  *asyncError = ncclSuccess;
  if (log_->takeFailure("ncclCommGetAsyncError")) {
    std::lock_guard<std::mutex> lock(errorMutex_);
    lastError_ = "injected asynchronous error";
    *asyncError = ncclRemoteError;
  }
  return ncclSuccess;
}

ncclResult_t RecordingNccl::allReduce(const void*, void*, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  log_->add("ncclAllReduce(count=" + std::to_string(count) + ", " + typeName(datatype) + ", " +
            opName(op) + ", " + commName(comm) + ", " + streamName(stream) + ")");
  return outcome("ncclAllReduce");
}

ncclResult_t RecordingNccl::broadcast(const void*, void*, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
  log_->add("ncclBroadcast(count=" + std::to_string(count) + ", " + typeName(datatype) + ", root=" +
            std::to_string(root) + ", " + commName(comm) + ", " + streamName(stream) + ")");
  return outcome("ncclBroadcast");
}

ncclResult_t RecordingNccl::reduce(const void*, void*, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  log_->add("ncclReduce(count=" + std::to_string(count) + ", " + typeName(datatype) + ", " +
            opName(op) + ", root=" + std::to_string(root) + ", " + commName(comm) + ", " +
            streamName(stream) + ")");
  return outcome("ncclReduce");
}

ncclResult_t RecordingNccl::allGather(const void*, void*, size_t sendcount, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
  log_->add("ncclAllGather(sendcount=" + std::to_string(sendcount) + ", " + typeName(datatype) +
            ", " + commName(comm) + ", " + streamName(stream) + ")");
  return outcome("ncclAllGather");
}

ncclResult_t RecordingNccl::reduceScatter(const void*, void*, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
  log_->add("ncclReduceScatter(recvcount=" + std::to_string(recvcount) + ", " + typeName(datatype) +
            ", " + opName(op) + ", " + commName(comm) + ", " + streamName(stream) + ")");
  return outcome("ncclReduceScatter");
}

ncclResult_t RecordingNccl::send(const void*, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
  log_->add("ncclSend(count=" + std::to_string(count) + ", " + typeName(datatype) + ", peer=" +
            std::to_string(peer) + ", " + commName(comm) + ", " + streamName(stream) + ")");
  return outcome("ncclSend");
}

ncclResult_t RecordingNccl::recv(void*, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
  log_->add("ncclRecv(count=" + std::to_string(count) + ", " + typeName(datatype) + ", peer=" +
            std::to_string(peer) + ", " + commName(comm) + ", " + streamName(stream) + ")");
  return outcome("ncclRecv");
}

ncclResult_t RecordingNccl::groupStart() {
  log_->add("ncclGroupStart()");
  return outcome("ncclGroupStart");
}

ncclResult_t RecordingNccl::groupEnd() {
  log_->add("ncclGroupEnd()");
  return outcome("ncclGroupEnd");
}

ncclResult_t RecordingNccl::redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                 ncclDataType_t datatype,
                                                 ncclScalarResidence_t residence, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  *op = static_cast<ncclRedOp_t>(static_cast<int>(ncclNumOps) + redOpsMade_++);
  log_->add("ncclRedOpCreatePreMulSum(scalar=" + scalarText(scalar, datatype, residence) + ", " +
            typeName(datatype) + ", " + commName(comm) + ") -> " + opName(*op));
  return outcome("ncclRedOpCreatePreMulSum");
}

ncclResult_t RecordingNccl::redOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  log_->add("ncclRedOpDestroy(" + opName(op) + ", " + commName(comm) + ")");
  return outcome("ncclRedOpDestroy");
}

}  // namespace streamnccl::fake
