// The flight recorder's entry for every op, numbered as ProcessGroupNCCL numbers its ops
// (collectives and point-to-point ops apart, and one id across both), which is what torch's
// analyzer matches across ranks.

#include "core/hooks/Hooks.hpp"

#include <array>
#include <mutex>

namespace streamnccl::hooks {
namespace {

// "nccl:" and the op's kind, made once per kind rather than at every launch.
const std::string& profilingName(c10d::OpType opType) {
  static const auto names = [] {
    std::array<std::string, static_cast<size_t>(c10d::OpType::UNKNOWN) + 1> made;
    for (size_t type = 0; type < made.size(); ++type) {
      const auto opType = static_cast<c10d::OpType>(type);
      made[type] = std::string("nccl:") +
                   (opType == c10d::OpType::BARRIER ? "all_reduce_barrier" : opKindName(opType));
    }
    return made;
  }();
  return names.at(static_cast<size_t>(opType));
}

class RecorderEntries final : public LaunchHook {
 public:
  RecorderEntries(GroupView view, int64_t uid) : view_(view), uid_(uid) {}

  std::shared_ptr<void> launched(LaunchedOp& op) override {
    const Launch& launch = op.launch;
    const bool p2p = isPointToPoint(launch.opType);
    ++(p2p ? p2pSeq_ : collectiveSeq_);
    ++opId_;
    FlightRecorder& recorder = FlightRecorder::instance();
    if (!recorder.enabled()) {
      op.info.traceId = -1;
      return nullptr;
    }
    RecordedOp entry;
    entry.profilingName = profilingName(launch.opType);
    const int rank = view_.group.getRank();
    if (launch.opType == c10d::OpType::SEND) {
      entry.profilingName += " " + std::to_string(rank) + "->" + std::to_string(launch.peer);
    } else if (p2p) {
      entry.profilingName += " " + std::to_string(rank) + "<-" + std::to_string(launch.peer);
    }
    entry.p2p = p2p;
    entry.collectiveSeq = collectiveSeq_;
    entry.p2pSeq = p2pSeq_;
    entry.opId = opId_;
    entry.timeout = op.timeout;
    op.info.traceId = recorder.record(recordedGroup(), std::move(entry), launch.inputs.get(),
                                      launch.outputs, op.clock);
    return nullptr;
  }

 private:
  // The group as its entries name it, made at its first recorded op: torch names the group
  // after making it.
  const std::shared_ptr<const RecordedGroup>& recordedGroup() {
    if (ready_.load(std::memory_order_acquire)) {  // every op but the first
      return group_;
    }
    std::call_once(made_, [&] {
      auto group = std::make_shared<RecordedGroup>();
      group->uid = uid_;
      const std::string& name = view_.group.getGroupUid();
      group->name = name.empty() ? std::to_string(uid_) : name;
      group->desc = view_.group.getGroupDesc();
      group->globalRanks = view_.globalRanks;
      group_ = std::move(group);
      ready_.store(true, std::memory_order_release);
    });
    return group_;
  }

  GroupView view_;
  const int64_t uid_;  // this process's count of groups
  // Bumped by the launching thread only (a group's ops are launched one at a time).
  uint64_t collectiveSeq_ = 0;
  uint64_t p2pSeq_ = 0;
  uint64_t opId_ = 0;
  std::once_flag made_;
  std::atomic<bool> ready_{false};  // group_ is made: no call_once needed
  std::shared_ptr<const RecordedGroup> group_;
};

}  // namespace

std::unique_ptr<LaunchHook> recorderEntries(GroupView view, int64_t uid) {
  return std::make_unique<RecorderEntries>(view, uid);
}

}  // namespace streamnccl::hooks
