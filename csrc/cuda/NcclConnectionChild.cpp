// NcclConnection, the part of one made from another (NcclConnection::fromParent): the
// parent's ncclCommShrink or ncclCommSplit, and how a failed one ends. NCCL makes the new
// communicator on a thread of its own, tied to the parent; only the parent's abort ends that
// thread, and it comes through the parent's group (Watchdog.hpp's rule: its ops in flight fail
// first).

#include "cuda/NcclConnection.hpp"

#include "core/Errors.hpp"
#include "cuda/NcclErrors.hpp"

#include <c10/util/Logging.h>

namespace streamnccl {

void NcclConnection::tellMembersChildFailed(const std::exception_ptr& failure) {
  std::string why = "it failed";
  try {
    std::rethrow_exception(failure);
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (why.find("another member gave up") != std::string::npos) {
    return;  // the first to give up has said why
  }
  try {
    settings_.store->set(childOf_->failedKey, std::vector<uint8_t>(why.begin(), why.end()));
  } catch (const std::exception& e) {
    LOG(WARNING) << who() << " could not tell the other members that " << makingCall()
                 << " failed: " << e.what();
  }
}

ncclResult_t NcclConnection::makeFromParent(ncclComm_t* comm,
                                            std::chrono::steady_clock::time_point deadline) {
  NcclConnection& parent = *childOf_->parent;
  // NCCL builds the new one from the parent's state. Held, the parent is polled by no other
  // thread (asyncError() waits for a moment with no use), and its state is the shrink's own to
  // poll until it is done (shrinking_): NCCL's poll of it ends the thread making the new one.
  parent.acquire(makingCall());
  ncclComm_t parentComm = nullptr;
  {
    std::lock_guard<std::mutex> lock(parent.mutex_);
    parentComm = parent.comm_;
    ++parent.shrinking_;
  }
  auto endShrinking = [&parent] {
    {
      std::lock_guard<std::mutex> lock(parent.mutex_);
      --parent.shrinking_;
    }
    parent.changed_.notify_all();
  };
  // NCCL writes the new communicator here from a thread of its own, once that thread is done,
  // which may be after this call has given up: so it is not on this stack, and it is freed
  // only once NCCL's thread has ended.
  auto* into = new ncclComm_t(nullptr);
  ncclResult_t result = ncclInternalError;
  bool started = false;  // NCCL's thread making the new one was started
  try {
    result = callParent(parentComm, into);
    started = result == ncclInProgress || __atomic_load_n(into, __ATOMIC_ACQUIRE) != nullptr;
    if (result == ncclSuccess || result == ncclInProgress) {
      // Done when the parent's state leaves ncclInProgress: NCCL's thread has then written
      // the new communicator (failed or not) to `into`.
      result = pollUntilSettled(parentComm, makingCall(), deadline,
                                /*ofParentMakingChild=*/true);
    }
    if (result != ncclSuccess && started) {
      // NCCL reports a new one that failed on the parent (as a sticky asynchronous error), and
      // unlinks the parent from the new one's abort flag only when it is made well: a failed
      // one is freed only after the parent's abort (endChildInProgress).
      throwNcclError(nccl(), result, makingCall(), who(), nullptr, __FILE__, __LINE__);
    }
  } catch (...) {
    // Still making it (so the watchdog leaves the parent's state alone) until the parent is
    // aborted, which needs this use of it to end first.
    parent.endUse();
    if (started) {
      endChildInProgress(into, describeException(std::current_exception()));
    } else {
      // Refused at the call: nothing was started. (NCCL 2.28 to 2.30 may have linked the
      // parent to the new one's abort flag before refusing, and freed that flag: the parent's
      // abort would then write to freed memory. Options refuse the configs that fail there;
      // NCCL_* variables overriding them can still.)
      LOG(WARNING) << who() << " " << makingCall() << " refused at the call: the parent "
                   << parent.who() << " stays as it was";
      delete into;
    }
    endShrinking();
    throw;
  }
  *comm = __atomic_load_n(into, __ATOMIC_ACQUIRE);
  delete into;
  endShrinking();
  parent.endUse();
  return result;
}

ncclResult_t NcclConnection::callParent(ncclComm_t parentComm, ncclComm_t* into) {
  auto onDevice = settings_.cuda->useDevice(settings_.device);
  ncclConfig_t config = ncclConfig();
  if (childOf_->how == ChildOf::How::Split) {
    return nccl().commSplit(parentComm, childOf_->color, childOf_->key, into, &config);
  }
  std::vector<int> excluded = childOf_->excluded;  // NCCL sorts it in place
  return nccl().commShrink(parentComm, excluded.data(), static_cast<int>(excluded.size()), into,
                           &config,
                           childOf_->abortInFlight ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
}

void NcclConnection::endChildInProgress(ncclComm_t* into, const std::string& why) {
  NcclConnection& parent = *childOf_->parent;
  LOG(WARNING) << who() << " " << makingCall() << " of " << parent.who()
               << " failed: breaking the parent's group, whose communicators' abort alone "
                  "ends NCCL's making of the new one";
  parent.breakParent(std::string(makingCall()) + " of this communicator failed: " + why);
  if (!parent.waitAbortReturned()) {
    LOG(WARNING) << who() << " left to NCCL: its " << makingCall()
                 << " may still write the new communicator";
    return;  // `into` stays allocated, for NCCL's thread to write to
  }
  ncclComm_t child = __atomic_load_n(into, __ATOMIC_ACQUIRE);
  delete into;
  if (child != nullptr) {  // made, but failed: freed as NCCL asks of a failed init
    auto onDevice = settings_.cuda->useDevice(settings_.device);
    if (const ncclResult_t result = nccl().commAbort(child); result != ncclSuccess) {
      LOG(WARNING) << who() << " ncclCommAbort failed: " << nccl().getErrorString(result);
    }
  }
}

void NcclConnection::setBreakRequest(std::function<void(const std::string&)> request) {
  std::lock_guard<std::mutex> lock(mutex_);
  breakRequest_ = std::move(request);
}

void NcclConnection::breakParent(const std::string& why) {
  std::function<void(const std::string&)> request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    request = breakRequest_;
  }
  if (request) {
    request(who() + " " + why);  // fails the group's ops in flight, then aborts this
  }
  // Already broken, the group may have left its communicators to a shrink with
  // NCCL_SHRINK_ABORT (ProcessGroup::shrink); no group at all watches one never used by an op.
  // Either way no op of it is left to fail: aborting it now is the break's last step.
  abort();
}

std::string NcclConnection::childGivenUp() const {
  auto& store = *settings_.store;
  if (!store.check({childOf_->failedKey})) {
    return {};
  }
  const std::vector<uint8_t> why = store.get(childOf_->failedKey);
  return std::string(why.begin(), why.end());
}

}  // namespace streamnccl
