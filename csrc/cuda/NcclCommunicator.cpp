#include "cuda/NcclCommunicator.hpp"

#include "cuda/NcclErrors.hpp"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

namespace streamnccl {
namespace {

std::optional<ncclDataType_t> ncclTypeOf(at::ScalarType dtype) {
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
      return std::nullopt;
  }
}

// Every buffer reaches here checked: movement ops pass bytes, reductions passed
// reductionRefusal() at the call.
ncclDataType_t ncclType(at::ScalarType dtype) {
  auto type = ncclTypeOf(dtype);
  TORCH_INTERNAL_ASSERT(type, "streamnccl: dtype ", dtype, " has no NCCL equivalent");
  return *type;
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
  // Refused at the call (reductionRefusal), before anything of the op was issued.
  TORCH_INTERNAL_ASSERT(false, "streamnccl: reduce op ", toString(kind), " reached NCCL");
}

}  // namespace

// The ncclRedOp_t of one call: a built-in op, or a PreMulSum op made for the call and
// destroyed once it is issued (NCCL allows that: the issued call keeps what it needs).
class NcclCommunicator::ScopedRedOp {
 public:
  ScopedRedOp(const NcclConnection::Use& use, const ReduceOp& op, ncclDataType_t type,
              NcclApi& nccl, const std::string& who)
      : use_(use), nccl_(nccl), who_(who) {
    if (op.kind != ReduceKind::PreMulSum) {
      op_ = ncclOp(op.kind);
      return;
    }
    // A scalar is read now, from the host; a tensor factor when the reduction runs.
    const auto residence = op.factorOnHost ? ncclScalarHostImmediate : ncclScalarDevice;
    use.check("ncclRedOpCreatePreMulSum",
              nccl.redOpCreatePreMulSum(&op_, op.factor.data_ptr(), type, residence, use.comm()));
    created_ = true;
  }
  ~ScopedRedOp() {
    if (created_) {
      const ncclResult_t result = nccl_.redOpDestroy(op_, use_.comm());
      if (result != ncclSuccess) {
        LOG(WARNING) << who_ << " ncclRedOpDestroy failed: " << nccl_.getErrorString(result);
      }
    }
  }
  ScopedRedOp(const ScopedRedOp&) = delete;
  ScopedRedOp& operator=(const ScopedRedOp&) = delete;

  ncclRedOp_t get() const { return op_; }

 private:
  const NcclConnection::Use& use_;
  NcclApi& nccl_;
  const std::string& who_;
  ncclRedOp_t op_ = ncclSum;
  bool created_ = false;
};

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda,
                                   c10::intrusive_ptr<c10d::Store> store, int groupRank,
                                   int groupSize, c10::Device device, NcclMembership membership,
                                   std::chrono::milliseconds timeout, Options::NcclConfig config)
    : nccl_(std::move(nccl)),
      cuda_(std::move(cuda)),
      who_(std::move(membership.who)),
      members_(std::move(membership.members)),
      device_(device),
      computeCapability_(cuda_->computeCapability(device)),
      key_(membership.idKey),
      config_(std::move(config)),
      name_(membership.name),
      allToAllLoaded_(nccl_->hasAllToAll()),
      connection_(NcclConnection::open(NcclConnection::Settings{
          nccl_, cuda_, std::move(store), device,
          members_.empty() ? groupSize : static_cast<int>(members_.size()), commRank(groupRank),
          // The member of lowest group rank makes the id, so rank 0 never waits for one.
          members_.empty() ? groupRank == 0
                           : groupRank == *std::min_element(members_.begin(), members_.end()),
          std::move(membership.idKey), who_, timeout, config_, name_})) {}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda,
                                   c10::Device device, std::string who, std::string key,
                                   std::shared_ptr<NcclConnection> connection,
                                   Options::NcclConfig config, std::string name)
    : nccl_(std::move(nccl)),
      cuda_(std::move(cuda)),
      who_(std::move(who)),
      device_(device),
      computeCapability_(cuda_->computeCapability(device)),
      key_(std::move(key)),
      config_(std::move(config)),
      name_(std::move(name)),
      allToAllLoaded_(nccl_->hasAllToAll()),
      connection_(std::move(connection)) {}

std::shared_ptr<NcclCommunicator> NcclCommunicator::shrunk(
    const std::vector<int>& excluded, bool abortInFlight, int groupRank, int groupSize,
    std::string who, std::chrono::milliseconds timeout, Options::NcclConfig config,
    c10::intrusive_ptr<c10d::Store> store) const {
  TORCH_INTERNAL_ASSERT(members_.empty(), "streamnccl: only a group's own communicator shrinks");
  NcclConnection::ChildOf origin;
  origin.how = NcclConnection::ChildOf::How::Shrink;
  origin.excluded = excluded;
  origin.abortInFlight = abortInFlight;
  return child("shrunk-" + c10::Join("-", excluded), std::move(origin), groupRank, groupSize,
               std::move(who), timeout, std::move(config), std::move(store));
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::split(
    int color, int groupRank, int groupSize, std::string who, const std::string& tag,
    std::chrono::milliseconds timeout, Options::NcclConfig config,
    c10::intrusive_ptr<c10d::Store> store) const {
  TORCH_INTERNAL_ASSERT(members_.empty(), "streamnccl: only a group's own communicator splits");
  TORCH_INTERNAL_ASSERT(color >= 0, "streamnccl: a split's color is not negative");
  NcclConnection::ChildOf origin;
  origin.how = NcclConnection::ChildOf::How::Split;
  origin.color = color;
  origin.key = groupRank;
  return child(tag, std::move(origin), groupRank, groupSize, std::move(who), timeout,
               std::move(config), std::move(store));
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::child(
    const std::string& tag, NcclConnection::ChildOf origin, int groupRank, int groupSize,
    std::string who, std::chrono::milliseconds timeout, Options::NcclConfig config,
    c10::intrusive_ptr<c10d::Store> store) const {
  // Named after its parent, which every member shares: the order ranks close it in.
  std::string key = key_ + "/" + tag;
  std::string name = name_.empty() ? "" : name_ + " " + tag;
  origin.parent = connection_;
  origin.failedKey = kChildFailedKey;
  auto connection = NcclConnection::fromParent(
      NcclConnection::Settings{nccl_, cuda_, std::move(store), device_, groupSize, groupRank, false,
                               key, who, timeout, config, name},
      std::move(origin));
  return std::shared_ptr<NcclCommunicator>(
      new NcclCommunicator(nccl_, cuda_, device_, std::move(who), std::move(key),
                           std::move(connection), std::move(config), std::move(name)));
}

void NcclCommunicator::splitWithoutColor(std::chrono::milliseconds timeout,
                                         c10::intrusive_ptr<c10d::Store> store) const {
  TORCH_INTERNAL_ASSERT(members_.empty(), "streamnccl: only a group's own communicator splits");
  NcclConnection::ChildOf origin;
  origin.parent = connection_;
  origin.how = NcclConnection::ChildOf::How::Split;
  origin.color = NCCL_SPLIT_NOCOLOR;
  origin.failedKey = kChildFailedKey;
  auto part = NcclConnection::fromParent(
      NcclConnection::Settings{nccl_, cuda_, std::move(store), device_, 0, 0, false, key_ + "/none",
                               who_, timeout, config_, ""},
      std::move(origin));
  part->waitConnected();
}

NcclCommunicator::~NcclCommunicator() { connection_->abandon(); }

int NcclCommunicator::commRank(int groupRank) const {
  if (members_.empty()) {
    return groupRank;
  }
  const auto found = std::find(members_.begin(), members_.end(), groupRank);
  TORCH_INTERNAL_ASSERT(found != members_.end(), who_, " group rank ", groupRank,
                        " is not a member of this communicator");
  return static_cast<int>(found - members_.begin());
}

std::string NcclCommunicator::reductionRefusal(ReduceKind kind, at::ScalarType dtype) const {
  if (kind == ReduceKind::BitAnd || kind == ReduceKind::BitOr || kind == ReduceKind::BitXor) {
    return "NCCL has no bitwise reductions, so reduce op " + toString(kind) +
           " is not supported on CUDA tensors (it is on CPU tensors, through the host path)";
  }
  if (!ncclTypeOf(dtype)) {
    return "NCCL cannot reduce dtype " + std::string(c10::toString(dtype)) +
           ": it has no NCCL datatype (ops that only move data take every dtype)";
  }
  if (at::isFloat8Type(dtype) && computeCapability_ < 90) {
    return "NCCL cannot reduce dtype " + std::string(c10::toString(dtype)) +
           " on this GPU: float8 reductions need compute capability 9.0 (sm90) or newer, this "
           "one has " +
           std::to_string(computeCapability_ / 10) + "." + std::to_string(computeCapability_ % 10);
  }
  return {};
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
  auto use = connection_->use("ncclAllReduce");
  const ncclDataType_t type = ncclType(input.scalar_type());
  ScopedRedOp redOp(use, op, type, *nccl_, who_);
  use.check("ncclAllReduce",
            nccl_->allReduce(input.data_ptr(), output.data_ptr(), input.numel(), type, redOp.get(),
                             use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                                 c10::Stream stream) {
  auto use = connection_->use("ncclBroadcast");
  use.check("ncclBroadcast", nccl_->broadcast(input.data_ptr(), output.data_ptr(), output.numel(),
                                              ncclType(output.scalar_type()), commRank(root),
                                              use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::allGather(const at::Tensor& input, const at::Tensor& output,
                                 c10::Stream stream) {
  auto use = connection_->use("ncclAllGather");
  use.check("ncclAllGather",
            nccl_->allGather(input.data_ptr(), output.data_ptr(), input.numel(),
                             ncclType(input.scalar_type()), use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::reduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                              int root, c10::Stream stream) {
  auto use = connection_->use("ncclReduce");
  const ncclDataType_t type = ncclType(input.scalar_type());
  ScopedRedOp redOp(use, op, type, *nccl_, who_);
  use.check("ncclReduce",
            nccl_->reduce(input.data_ptr(), output.data_ptr(), input.numel(), type, redOp.get(),
                          commRank(root), use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::reduceScatter(const at::Tensor& input, const at::Tensor& output,
                                     const ReduceOp& op, c10::Stream stream) {
  auto use = connection_->use("ncclReduceScatter");
  const ncclDataType_t type = ncclType(input.scalar_type());
  ScopedRedOp redOp(use, op, type, *nccl_, who_);
  use.check("ncclReduceScatter",
            nccl_->reduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type,
                                 redOp.get(), use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::allToAll(const at::Tensor& input, const at::Tensor& output,
                                const std::vector<int64_t>& inSplits,
                                const std::vector<int64_t>& outSplits, c10::Stream stream) {
  const int64_t block = inSplits.front();
  TORCH_INTERNAL_ASSERT(allToAllKind() == AllToAll::EqualBlocks &&
                            std::all_of(inSplits.begin(), inSplits.end(),
                                        [block](int64_t split) { return split == block; }) &&
                            inSplits == outSplits,
                        "streamnccl: ncclAlltoAll takes equal blocks only");
  auto use = connection_->use("ncclAlltoAll");
  use.check("ncclAlltoAll",
            nccl_->allToAll(input.data_ptr(), output.data_ptr(), block,
                            ncclType(input.scalar_type()), use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::send(const at::Tensor& input, int peer, c10::Stream stream) {
  auto use = connection_->use("ncclSend");
  use.check("ncclSend", nccl_->send(input.data_ptr(), input.numel(), ncclType(input.scalar_type()),
                                    commRank(peer), use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::recv(const at::Tensor& output, int peer, c10::Stream stream) {
  auto use = connection_->use("ncclRecv");
  use.check("ncclRecv",
            nccl_->recv(output.data_ptr(), output.numel(), ncclType(output.scalar_type()),
                        commRank(peer), use.comm(), cuda_->native(stream)));
}

void NcclCommunicator::groupStart() {
  // The outermost group holds the communicator until it ends: abort() waits for it, instead of
  // freeing the communicator between two of the group's calls.
  if (groupDepth_++ == 0) {
    try {
      connection_->acquire("ncclGroupStart");
    } catch (...) {
      --groupDepth_;
      throw;
    }
  }
  try {
    STREAMNCCL_NCCL_CHECK(*nccl_, "ncclGroupStart", groupStart(), who_, nullptr);
  } catch (...) {
    if (--groupDepth_ == 0) {
      connection_->release();
    }
    throw;
  }
}

void NcclCommunicator::groupEnd() {
  struct Release {
    NcclCommunicator& self;
    ~Release() {
      if (--self.groupDepth_ == 0) {
        self.connection_->release();
      }
    }
  } release{*this};
  // Always ends the group (the thread's NCCL state), on the hold groupStart() took; on a
  // non-blocking communicator the group may still be being issued when it returns.
  connection_->checkHeld("ncclGroupEnd", nccl_->groupEnd());
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
