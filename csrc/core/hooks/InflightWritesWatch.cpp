// The check of writes to an async op's tensors before its wait() (InflightWrites.hpp), as a
// hook: at issue it records the tensors' versions and hands the check to the Work, and wraps
// the op's steps so that its own kernels are credited to the group and its communicator writes
// through unversioned aliases. Captured ops run at replays, to which versions say nothing, and
// a sync op has run, or is queued on the caller's own stream, when its call returns.

#include "core/hooks/Hooks.hpp"

#include "core/Work.hpp"

namespace streamnccl::hooks {
namespace {

class InflightWritesWatch final : public LaunchHook {
 public:
  explicit InflightWritesWatch(std::shared_ptr<InflightWrites> writes)
      : writes_(std::move(writes)) {}

  void issued(LaunchedOp& op, Work& work) override {
    if (!op.launch.async || op.captured) {
      return;
    }
    std::shared_ptr<InflightWriteCheck> check =
        writes_->watch(work.info(), op.launch.inputs.get(), work.outputs());
    work.checkWrites(check);
    auto unversioned = std::make_shared<UnversionedTransport>(op.path.communicator);
    op.steps.issue = [issue = std::move(op.steps.issue), check, unversioned](
                         Transport& /*versioned*/, Kernels& kernels, c10::Stream stream) {
      kernels.creditWritesTo(&check->group());
      issue(*unversioned, kernels, stream);
    };
    op.steps.finish = [finish = std::move(op.steps.finish), check](Kernels& kernels) {
      kernels.creditWritesTo(&check->group());  // a Kernels of its own where calls settle later
      if (finish) {
        finish(kernels);
      }
      check->noteCompleted();  // before the future's callbacks, which may write the result
    };
  }

 private:
  const std::shared_ptr<InflightWrites> writes_;
};

}  // namespace

std::unique_ptr<LaunchHook> inflightWritesWatch(std::shared_ptr<InflightWrites> writes) {
  return std::make_unique<InflightWritesWatch>(std::move(writes));
}

}  // namespace streamnccl::hooks
