// What a group offers those who watch it, beside its ops: completion hooks, and the wait for
// every op issued so far (c10d's Backend methods of those names).

#include "core/Errors.hpp"
#include "core/ProcessGroup.hpp"

#include <c10/util/StringUtil.h>

namespace streamnccl {

void ProcessGroup::registerOnCompletionHook(
    std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  TORCH_CHECK_VALUE(hook, "streamnccl: registerOnCompletionHook: the hook is empty");
  launcher_.setTimed();  // its WorkInfo's active duration: the ops' times on their streams
  // What c10d's hasHooks() reads: torch then waits for pending works before destroying the
  // group. The hooks themselves are called from CompletionHooks.
  onCompletionHook_ = [](const std::shared_ptr<c10d::WorkInfo>&) {};
  watchdog_->completionHooks().add(std::move(hook), who());
}

void ProcessGroup::waitForPendingWorks() {
  const auto deadline = Watchdog::Clock::now() + options_->timeout;
  if (!watchdog_->finishOn({}, deadline) && !health_->broken()) {
    throwDistBackendError(who() + " waitForPendingWorks: op(s) still unfinished after the " +
                          "group's timeout of " + std::to_string(options_->timeout.count()) +
                          " ms: " + c10::Join(", ", watchdog_->unfinished()));
  }
  watchdog_->releaseCompleted();  // the ops ended are retired, and their hooks' calls queued
  if (!watchdog_->completionHooks().drain(deadline)) {
    throwDistBackendError(who() +
                          " waitForPendingWorks: the completion hooks were still running "
                          "after the group's timeout");
  }
}

}  // namespace streamnccl
