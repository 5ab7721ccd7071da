#include "cuda/NcclCommunicator.hpp"

#include "cuda/NcclErrors.hpp"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace streamnccl {
namespace {

ncclDataType_t ncclType(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case at::kBFloat16:
      return ncclBfloat16;
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case at::kFloat8_e4m3fn:
      return ncclFloat8e4m3;
    case at::kFloat8_e5m2:
      return ncclFloat8e5m2;
#endif
    case at::kChar:
      return ncclInt8;
    case at::kByte:
      return ncclUint8;
    case at::kBool:
      return ncclUint8;  // the core lowers bool reductions to MIN/MAX
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kUInt32:
      return ncclUint32;
    case at::kUInt64:
      return ncclUint64;
    default:
      break;
  }
  TORCH_CHECK_TYPE(false, "streamnccl: dtype ", dtype, " has no NCCL equivalent");
}

ncclRedOp_t ncclOp(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Sum:
      return ncclSum;
    case ReduceKind::Product:
      return ncclProd;
    case ReduceKind::Min:
      return ncclMin;
    case ReduceKind::Max:
      return ncclMax;
    case ReduceKind::Avg:
      return ncclAvg;
    case ReduceKind::BitAnd:
    case ReduceKind::BitOr:
    case ReduceKind::BitXor:
    case ReduceKind::PreMulSum:  // made per call, see ScopedRedOp
      break;
  }
  TORCH_CHECK_VALUE(false, "streamnccl: reduce op ", toString(kind),
                    " is not supported by NCCL (bitwise ops run on the host path only)");
}

}  // namespace

// The ncclRedOp_t of one call: a built-in op, or a PreMulSum op made for the call and
// destroyed once it is enqueued (NCCL allows that: the enqueued call keeps what it needs).
class NcclCommunicator::ScopedRedOp {
 public:
  ScopedRedOp(NcclCommunicator& communicator, const ReduceOp& op, ncclDataType_t type)
      : communicator_(communicator) {
    if (op.kind != ReduceKind::PreMulSum) {
      op_ = ncclOp(op.kind);
      return;
    }
    // A factor on the host is read now; one on the device when the reduction runs.
    const auto residence = op.factor.is_cpu() ? ncclScalarHostImmediate : ncclScalarDevice;
    STREAMNCCL_NCCL_CHECK(
        *communicator.nccl_, "ncclRedOpCreatePreMulSum",
        redOpCreatePreMulSum(&op_, op.factor.data_ptr(), type, residence, communicator.comm_),
        communicator.who_, communicator.comm_);
    created_ = true;
  }
  ~ScopedRedOp() {
    if (created_) {
      const ncclResult_t result = communicator_.nccl_->redOpDestroy(op_, communicator_.comm_);
      if (result != ncclSuccess) {
        LOG(WARNING) << communicator_.who_
                     << " ncclRedOpDestroy failed: " << communicator_.nccl_->getErrorString(result);
      }
    }
  }
  ScopedRedOp(const ScopedRedOp&) = delete;
  ScopedRedOp& operator=(const ScopedRedOp&) = delete;

  ncclRedOp_t get() const { return op_; }

 private:
  NcclCommunicator& communicator_;
  ncclRedOp_t op_ = ncclSum;
  bool created_ = false;
};

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda,
                                   c10d::Store& store, int groupRank, int groupSize,
                                   c10::Device device, NcclMembership membership)
    : nccl_(std::move(nccl)),
      cuda_(std::move(cuda)),
      who_(std::move(membership.who)),
      members_(std::move(membership.members)) {
  const int size = members_.empty() ? groupSize : static_cast<int>(members_.size());
  const int rank = commRank(groupRank);
  // The member of lowest group rank makes the id, so rank 0 never waits for one.
  const bool makesId = members_.empty()
                           ? groupRank == 0
                           : groupRank == *std::min_element(members_.begin(), members_.end());
  ncclUniqueId id;
  if (makesId) {
    STREAMNCCL_NCCL_CHECK(*nccl_, "ncclGetUniqueId", getUniqueId(&id), who_, nullptr);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(membership.idKey, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  } else {
    const std::vector<uint8_t> bytes = store.get(membership.idKey);
    TORCH_INTERNAL_ASSERT(bytes.size() == sizeof(id), "streamnccl: malformed NCCL unique id");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclComm_t comm = nullptr;
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclCommInitRank", commInitRank(&comm, size, id, rank, device),
                        who_, nullptr);
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (ncclComm_t comm = comm_.load()) {
    const ncclResult_t result = nccl_->commDestroy(comm);
    if (result != ncclSuccess) {
      LOG(WARNING) << who_ << " ncclCommDestroy failed: " << nccl_->getErrorString(result);
    }
  }
}

int NcclCommunicator::commRank(int groupRank) const {
  if (members_.empty()) {
    return groupRank;
  }
  const auto found = std::find(members_.begin(), members_.end(), groupRank);
  TORCH_INTERNAL_ASSERT(found != members_.end(), who_, " group rank ", groupRank,
                        " is not a member of this communicator");
  return static_cast<int>(found - members_.begin());
}

bool NcclCommunicator::supportsAvg(at::ScalarType dtype) const {
  return NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0) && at::isFloatingType(dtype);
}

bool NcclCommunicator::supportsPreMulSum(at::ScalarType dtype) const {
  return NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0) && at::isFloatingType(dtype) &&
         !at::isFloat8Type(dtype);
}

void NcclCommunicator::allReduce(const at::Tensor& input, const at::Tensor& output,
                                 const ReduceOp& op, c10::Stream stream) {
  const ncclDataType_t type = ncclType(input.scalar_type());
  ScopedRedOp redOp(*this, op, type);
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclAllReduce",
                        allReduce(input.data_ptr(), output.data_ptr(), input.numel(), type,
                                  redOp.get(), comm_, cuda_->native(stream)),
                        who_, comm_);
}

void NcclCommunicator::broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                                 c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(
      *nccl_, "ncclBroadcast",
      broadcast(input.data_ptr(), output.data_ptr(), output.numel(), ncclType(output.scalar_type()),
                commRank(root), comm_, cuda_->native(stream)),
      who_, comm_);
}

void NcclCommunicator::allGather(const at::Tensor& input, const at::Tensor& output,
                                 c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclAllGather",
                        allGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                  ncclType(input.scalar_type()), comm_, cuda_->native(stream)),
                        who_, comm_);
}

void NcclCommunicator::reduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                              int root, c10::Stream stream) {
  const ncclDataType_t type = ncclType(input.scalar_type());
  ScopedRedOp redOp(*this, op, type);
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclReduce",
                        reduce(input.data_ptr(), output.data_ptr(), input.numel(), type,
                               redOp.get(), commRank(root), comm_, cuda_->native(stream)),
                        who_, comm_);
}

void NcclCommunicator::reduceScatter(const at::Tensor& input, const at::Tensor& output,
                                     const ReduceOp& op, c10::Stream stream) {
  const ncclDataType_t type = ncclType(input.scalar_type());
  ScopedRedOp redOp(*this, op, type);
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclReduceScatter",
                        reduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type,
                                      redOp.get(), comm_, cuda_->native(stream)),
                        who_, comm_);
}

void NcclCommunicator::send(const at::Tensor& input, int peer, c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclSend",
                        send(input.data_ptr(), input.numel(), ncclType(input.scalar_type()),
                             commRank(peer), comm_, cuda_->native(stream)),
                        who_, comm_);
}

void NcclCommunicator::recv(const at::Tensor& output, int peer, c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclRecv",
                        recv(output.data_ptr(), output.numel(), ncclType(output.scalar_type()),
                             commRank(peer), comm_, cuda_->native(stream)),
                        who_, comm_);
}

void NcclCommunicator::groupStart() {
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclGroupStart", groupStart(), who_, comm_);
}

void NcclCommunicator::groupEnd() {
  STREAMNCCL_NCCL_CHECK(*nccl_, "ncclGroupEnd", groupEnd(), who_, comm_);
}

void NcclCommunicator::abort() {
  ncclComm_t comm = comm_.exchange(nullptr);  // not destroyed again at destruction
  if (comm != nullptr) {
    const ncclResult_t result = nccl_->commAbort(comm);
    if (result != ncclSuccess) {
      LOG(WARNING) << who_ << " ncclCommAbort failed: " << nccl_->getErrorString(result);
    }
  }
}

std::string NcclCommunicator::asyncError() {
  ncclComm_t comm = comm_.load();
  if (comm == nullptr) {
    return {};
  }
  ncclResult_t asyncResult = ncclSuccess;
  const ncclResult_t result = nccl_->commGetAsyncError(comm, &asyncResult);
  if (result != ncclSuccess) {
    return who_ + " ncclCommGetAsyncError failed: " + nccl_->getErrorString(result);
  }
  if (asyncResult == ncclSuccess || asyncResult == ncclInProgress) {
    return {};
  }
  const char* detail = nccl_->getLastError(comm);
  return who_ + " asynchronous NCCL error: " + nccl_->getErrorString(asyncResult) +
         (detail && *detail ? std::string(" (") + detail + ")" : "");
}

int ncclCompiledVersion() { return NCCL_VERSION_CODE; }

int ncclLoadedVersion() {
  int version = 0;
  auto nccl = NcclApi::library();
  STREAMNCCL_NCCL_CHECK(*nccl, "ncclGetVersion", getVersion(&version), std::string("[streamnccl]"),
                        nullptr);
  return version;
}

}  // namespace streamnccl
