// torch.profiler's view of an op: the range RECORD_PARAM_COMMS_DATA opens in ProcessGroupNCCL,
// with the same metadata, so that the profiler's trace and its communication analysis read
// streamnccl's ops as they read the built-in backend's.

#include "core/hooks/Hooks.hpp"

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

#include <numeric>
#include <optional>

namespace streamnccl::hooks {
namespace {

int64_t elementsOf(const std::vector<at::Tensor>& tensors) {
  return std::accumulate(
      tensors.begin(), tensors.end(), int64_t{0},
      [](int64_t sum, const at::Tensor& tensor) { return sum + tensor.numel(); });
}

// The range and what it reads while open, ended in the reverse order of the members: the
// metadata outlives the range, as the macro's (the profiler reads it at the range's ends), and
// so do the inputs, of which the range keeps a view.
struct Range {
  std::optional<c10::DebugInfoGuard> metadata;
  std::vector<c10::IValue> params;
  std::optional<at::RecordFunction> range;
};

class ProfilerRange final : public LaunchHook {
 public:
  explicit ProfilerRange(GroupView view) : view_(view) {}

  std::shared_ptr<void> launched(LaunchedOp& op) override {
    // Asked first: when nothing observes ops (the common case) the answer is lock-free, and
    // nothing of the metadata is made. It takes one sampling step, as the macro's range does.
    auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION);
    if (!callbacks) {
      return nullptr;
    }
    const Launch& launch = op.launch;
    const c10d::Backend& group = view_.group;
    const std::vector<int>& ranks = view_.globalRanks;
    // The group's members as the profiler's metadata describes them: a start and a stride
    // when they are evenly spaced (-1 when not).
    const int start = ranks.front();
    int stride = ranks.size() > 1 ? ranks[1] - ranks[0] : 1;
    for (size_t i = 1; i < ranks.size(); ++i) {
      if (ranks[i] - ranks[i - 1] != stride) {
        stride = -1;
      }
    }
    const auto seq =
        std::make_tuple(static_cast<int64_t>(op.info.seq), isPointToPoint(launch.opType));
    const auto name = std::make_tuple(group.getGroupUid(), group.getGroupDesc());
    auto held = std::make_shared<Range>();
    held->metadata.emplace(
        c10::DebugInfoKind::PARAM_COMMS_INFO,
        std::make_shared<torch::ParamCommsDebugInfo>(
            name, group.getRank(), launch.op, elementsOf(launch.inputs.get()),
            elementsOf(launch.outputs), launch.shapeOf.scalar_type(), launch.inputSplitSizes,
            launch.outputSplitSizes, start, stride, group.getSize()));
    at::RecordFunction& range = held->range.emplace(std::move(*callbacks));
    if (range.needsInputs()) {
      const std::initializer_list<const c10::IValue> values = {c10::IValue(launch.inputs.get()),
                                                               seq,
                                                               name,
                                                               group.getRank(),
                                                               launch.op,
                                                               launch.inputSplitSizes,
                                                               launch.outputSplitSizes,
                                                               start,
                                                               stride,
                                                               group.getSize()};
      held->params.assign(values.begin(), values.end());
      range.before(at::kParamCommsCallName,
                   c10::ArrayRef<const c10::IValue>(held->params.data(), held->params.size()));
    } else {
      range.before(at::kParamCommsCallName);
    }
    if (range.needsOutputs()) {
      range.setOutputs(std::vector<c10::IValue>(1, c10::IValue(launch.outputs)));
    }
    return held;
  }

 private:
  GroupView view_;
};

}  // namespace

std::unique_ptr<LaunchHook> profilerRange(GroupView view) {
  return std::make_unique<ProfilerRange>(view);
}

}  // namespace streamnccl::hooks
