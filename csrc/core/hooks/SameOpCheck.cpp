// The debug same-op check (STREAMNCCL_DEBUG_CHECKS): before a collective is issued, every rank
// writes what it issues to the group's Store and reads every other rank's, so that a mismatch
// (another op, shape or dtype) fails at the call on every rank, naming both, instead of
// hanging in NCCL or reducing garbage. Slow: a Store round trip per rank per collective.

#include "core/hooks/Hooks.hpp"

#include "core/Errors.hpp"
#include "core/StoreKeys.hpp"

#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <sstream>

namespace streamnccl::hooks {
namespace {

// What this rank issues, as the other ranks must have issued it too.
std::string describeForPeers(const Launch& launch, const OpInfo& info) {
  using c10d::OpType;
  const OpType opType = launch.opType;
  // Ops whose tensors may differ in shape between ranks are matched by name and dtype only.
  const bool shapesMatch = opType != OpType::ALLTOALL_BASE && opType != OpType::ALLTOALL &&
                           opType != OpType::GATHER && opType != OpType::SCATTER;
  std::ostringstream mine;
  mine << info.name << " (";
  if (shapesMatch) {
    mine << "[" << c10::Join(", ", info.shape) << "], ";
  }
  mine << c10::toString(info.dtype);
  if (opType == OpType::ALLTOALL_BASE) {
    // Without them NCCL's path may take ncclAlltoAll, which need not meet sends and recvs on
    // the other ranks (PointToPoint.cpp).
    const bool given = !launch.inputSplitSizes.empty() || !launch.outputSplitSizes.empty();
    mine << (given ? ", split sizes given" : ", no split sizes");
  }
  mine << ")";
  return mine.str();
}

class SameOpCheck final : public LaunchHook {
 public:
  SameOpCheck(GroupView view, c10::intrusive_ptr<c10d::Store> store,
              std::shared_ptr<Watchdog> watchdog)
      : view_(view), store_(std::move(store)), watchdog_(std::move(watchdog)) {}

  std::shared_ptr<void> launched(LaunchedOp& op) override {
    using c10d::OpType;
    const OpType opType = op.launch.opType;
    // Point-to-point ops, alone or batched, involve only some ranks: nothing to match.
    if (opType == OpType::SEND || opType == OpType::RECV || opType == OpType::COALESCED) {
      return nullptr;
    }
    TORCH_CHECK(store_, "streamnccl: debug checks need the group's Store");
    const std::string text = describeForPeers(op.launch, op.info);
    const std::string prefix = keys::debugCheck(++checked_);
    const int rank = view_.group.getRank();
    store_->set(prefix + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
    for (const auto peer : c10::irange(view_.group.getSize())) {
      if (peer == rank) {
        continue;
      }
      const auto bytes = store_->get(prefix + std::to_string(peer));
      const std::string theirs(bytes.begin(), bytes.end());
      if (theirs != text) {
        refuse(op.info, "this rank issued " + text + " but rank " + std::to_string(peer) +
                            " issued " + theirs + " as collective #" + std::to_string(checked_));
      }
    }
    return nullptr;
  }

 private:
  [[noreturn]] void refuse(const OpInfo& info, const std::string& why) {
    auto error = makeDistBackendError(info.describe() + ": debug check failed: " + why);
    watchdog_->health().recorder().failed(info.traceId, describeException(error));
    OpInfo group;
    group.rank = info.rank;
    group.size = info.size;
    group.group = info.group;
    watchdog_->breakGroup(group, error);
    std::rethrow_exception(error);
  }

  GroupView view_;
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::shared_ptr<Watchdog> watchdog_;
  uint64_t checked_ = 0;  // the collectives checked: p2p ops do not take part
};

}  // namespace

std::unique_ptr<LaunchHook> sameOpCheck(GroupView view, c10::intrusive_ptr<c10d::Store> store,
                                        std::shared_ptr<Watchdog> watchdog) {
  return std::make_unique<SameOpCheck>(view, std::move(store), std::move(watchdog));
}

}  // namespace streamnccl::hooks
