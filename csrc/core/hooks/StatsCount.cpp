// streamnccl.stats(): every op issued, counted by kind with its bytes; counted in flight until
// the watchdog retires it (captured ops are never tracked).

#include "core/hooks/Hooks.hpp"

#include "core/Work.hpp"

#include <algorithm>
#include <numeric>

namespace streamnccl::hooks {
namespace {

uint64_t bytesOf(const std::vector<at::Tensor>& tensors) {
  return std::accumulate(
      tensors.begin(), tensors.end(), uint64_t{0},
      [](uint64_t sum, const at::Tensor& tensor) { return sum + tensor.nbytes(); });
}

class StatsCount final : public LaunchHook {
 public:
  explicit StatsCount(std::shared_ptr<GroupStats> stats) : stats_(std::move(stats)) {}

  void issued(LaunchedOp& op, Work& work) override {
    // The larger of what the op sends and what it receives, as nccl-tests counts a message.
    const uint64_t bytes = std::max(bytesOf(op.launch.inputs.get()), bytesOf(work.outputs()));
    stats_->launched(op.launch.opType, bytes, /*tracked=*/!op.captured);
  }

 private:
  const std::shared_ptr<GroupStats> stats_;
};

}  // namespace

std::unique_ptr<LaunchHook> statsCount(std::shared_ptr<GroupStats> stats) {
  return std::make_unique<StatsCount>(std::move(stats));
}

}  // namespace streamnccl::hooks
