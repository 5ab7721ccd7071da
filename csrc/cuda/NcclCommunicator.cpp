#include "cuda/NcclCommunicator.hpp"

#include "cuda/NcclErrors.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <cstring>

namespace streamnccl {
namespace {

cudaStream_t cudaStreamOf(c10::Stream stream) { return c10::cuda::CUDAStream(stream).stream(); }

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
      break;
  }
  TORCH_CHECK_VALUE(false, "streamnccl: reduce op ", toString(kind),
                    " is not supported by NCCL (bitwise ops run on the host path only)");
}

}  // namespace

NcclCommunicator::NcclCommunicator(c10d::Store& store, int groupRank, int groupSize,
                                   c10::Device device, NcclMembership membership)
    : who_(std::move(membership.who)), members_(std::move(membership.members)) {
  const int size = members_.empty() ? groupSize : static_cast<int>(members_.size());
  const int rank = commRank(groupRank);
  ncclUniqueId id;
  if (rank == 0) {
    STREAMNCCL_NCCL_CHECK(ncclGetUniqueId(&id), who_, nullptr);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(membership.idKey, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  } else {
    const std::vector<uint8_t> bytes = store.get(membership.idKey);
    TORCH_INTERNAL_ASSERT(bytes.size() == sizeof(id), "streamnccl: malformed NCCL unique id");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  c10::cuda::CUDAGuard guard(device);
  STREAMNCCL_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank), who_, nullptr);
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

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    const ncclResult_t result = ncclCommDestroy(comm_);
    if (result != ncclSuccess) {
      LOG(WARNING) << who_ << " ncclCommDestroy failed: " << ncclGetErrorString(result);
    }
  }
}

bool NcclCommunicator::supportsAvg(at::ScalarType dtype) const {
  return NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0) && at::isFloatingType(dtype);
}

void NcclCommunicator::allReduce(const at::Tensor& input, const at::Tensor& output, ReduceKind op,
                                 c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(
      ncclAllReduce(input.data_ptr(), output.data_ptr(), input.numel(),
                    ncclType(input.scalar_type()), ncclOp(op), comm_, cudaStreamOf(stream)),
      who_, comm_);
}

void NcclCommunicator::broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                                 c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(
      ncclBroadcast(input.data_ptr(), output.data_ptr(), output.numel(),
                    ncclType(output.scalar_type()), commRank(root), comm_, cudaStreamOf(stream)),
      who_, comm_);
}

void NcclCommunicator::allGather(const at::Tensor& input, const at::Tensor& output,
                                 c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                      ncclType(input.scalar_type()), comm_, cudaStreamOf(stream)),
                        who_, comm_);
}

void NcclCommunicator::reduce(const at::Tensor& input, const at::Tensor& output, ReduceKind op,
                              int root, c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(
      ncclReduce(input.data_ptr(), output.data_ptr(), input.numel(), ncclType(input.scalar_type()),
                 ncclOp(op), commRank(root), comm_, cudaStreamOf(stream)),
      who_, comm_);
}

void NcclCommunicator::reduceScatter(const at::Tensor& input, const at::Tensor& output,
                                     ReduceKind op, c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(
      ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                        ncclType(input.scalar_type()), ncclOp(op), comm_, cudaStreamOf(stream)),
      who_, comm_);
}

void NcclCommunicator::send(const at::Tensor& input, int peer, c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(ncclSend(input.data_ptr(), input.numel(), ncclType(input.scalar_type()),
                                 commRank(peer), comm_, cudaStreamOf(stream)),
                        who_, comm_);
}

void NcclCommunicator::recv(const at::Tensor& output, int peer, c10::Stream stream) {
  STREAMNCCL_NCCL_CHECK(ncclRecv(output.data_ptr(), output.numel(), ncclType(output.scalar_type()),
                                 commRank(peer), comm_, cudaStreamOf(stream)),
                        who_, comm_);
}

void NcclCommunicator::groupStart() { STREAMNCCL_NCCL_CHECK(ncclGroupStart(), who_, comm_); }

void NcclCommunicator::groupEnd() { STREAMNCCL_NCCL_CHECK(ncclGroupEnd(), who_, comm_); }

int ncclCompiledVersion() { return NCCL_VERSION_CODE; }

int ncclLoadedVersion() {
  int version = 0;
  STREAMNCCL_NCCL_CHECK(ncclGetVersion(&version), std::string("[streamnccl]"), nullptr);
  return version;
}

}  // namespace streamnccl
