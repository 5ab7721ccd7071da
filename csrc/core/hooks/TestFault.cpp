// STREAMNCCL_TEST_FAULT: op N (counted from 1) of every group on this rank fails as it is
// issued, or is issued M ms late, so that the tests can make a fault happen where they want.
// Registered only on the rank it names.

#include "core/hooks/Hooks.hpp"

#include "core/Errors.hpp"

#include <thread>

namespace streamnccl::hooks {
namespace {

class TestFault final : public LaunchHook {
 public:
  explicit TestFault(Options::TestFault fault) : fault_(fault) {}

  std::shared_ptr<void> launched(LaunchedOp& op) override {
    if (op.info.seq != fault_.op) {
      return nullptr;
    }
    if (fault_.fail) {
      op.steps.issue = [](Transport&, Kernels&, c10::Stream) {
        throwDistBackendError("injected fault (STREAMNCCL_TEST_FAULT)");
      };
    } else {
      op.steps.issue = [issue = std::move(op.steps.issue), delay = fault_.delay](
                           Transport& comm, Kernels& kernels, c10::Stream stream) {
        std::this_thread::sleep_for(delay);
        issue(comm, kernels, stream);
      };
    }
    return nullptr;
  }

 private:
  const Options::TestFault fault_;
};

}  // namespace

std::unique_ptr<LaunchHook> testFault(Options::TestFault fault) {
  return std::make_unique<TestFault>(fault);
}

}  // namespace streamnccl::hooks
