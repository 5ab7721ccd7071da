// The time each op was issued, which completion hooks report (c10d's WorkInfo::timeStarted);
// read from the clock only while a completion hook is registered.

#include "core/hooks/Hooks.hpp"

#include "core/Work.hpp"

namespace streamnccl::hooks {
namespace {

class IssueTimes final : public LaunchHook {
 public:
  explicit IssueTimes(std::shared_ptr<Watchdog> watchdog) : watchdog_(std::move(watchdog)) {}

  void issued(LaunchedOp& /*op*/, Work& work) override {
    if (watchdog_->completionHooks().active()) {
      work.noteIssued(std::chrono::steady_clock::now());
    }
  }

 private:
  const std::shared_ptr<Watchdog> watchdog_;
};

}  // namespace

std::unique_ptr<LaunchHook> issueTimes(std::shared_ptr<Watchdog> watchdog) {
  return std::make_unique<IssueTimes>(std::move(watchdog));
}

}  // namespace streamnccl::hooks
