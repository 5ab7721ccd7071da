#include "core/Work.hpp"

#include "core/Errors.hpp"
#include "core/Watchdog.hpp"

namespace streamnccl {

OpOutcome::OpOutcome(at::TypePtr valueType, std::vector<c10::Device> futureDevices)
    : future_(c10::make_intrusive<c10::ivalue::Future>(std::move(valueType),
                                                       std::move(futureDevices))) {}

void OpOutcome::succeed(const std::vector<at::Tensor>& outputs) {
  if (!settled_.exchange(true)) {
    future_->markCompleted(c10::IValue(outputs));
  }
}

void OpOutcome::fail(const OpInfo& info, std::exception_ptr cause) {
  auto error = makeDistBackendError(info.describe() + ": " + describeException(cause));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_) {
      failure_ = error;
    }
  }
  if (!settled_.exchange(true)) {
    future_->setError(error);
  }
}

std::exception_ptr OpOutcome::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

Work::Work(OpInfo info, c10d::OpType opType, std::shared_ptr<Device> device,
           std::shared_ptr<OpOutcome> outcome, std::vector<at::Tensor> outputs,
           std::chrono::milliseconds timeout, bool blockHostOnWait,
           std::weak_ptr<Watchdog> watchdog)
    : c10d::Work(info.rank, opType),
      info_(std::move(info)),
      device_(std::move(device)),
      outcome_(std::move(outcome)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      deadline_(std::chrono::steady_clock::now() + timeout),
      blockHostOnWait_(blockHostOnWait),
      watchdog_(std::move(watchdog)) {}

void Work::fail(const std::string& reason) {
  outcome_->fail(info_, std::make_exception_ptr(std::runtime_error(reason)));
}

void Work::setEnd(std::unique_ptr<Event> end, std::vector<at::Tensor> inUse, bool joinOnWait) {
  end_ = std::move(end);
  joinOnWait_ = joinOnWait;
  inUse_ = std::move(inUse);
}

bool Work::isCompleted() { return captured_ || end_ == nullptr || end_->query(); }

bool Work::isSuccess() const { return outcome_->failure() == nullptr; }

std::exception_ptr Work::exception() const { return outcome_->failure(); }

std::vector<at::Tensor> Work::result() { return outputs_; }

void Work::synchronize() {
  if (end_ && joinOnWait_) {
    end_->block(device_->currentStream());
  }
}

bool Work::wait(std::chrono::milliseconds timeout) {
  if (end_) {
    if ((blockHostOnWait_ || timeout != kNoTimeout) && !captured_) {
      const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
      if (!end_->synchronize(limit)) {
        // The ranks are no longer known to be in step: the group breaks, as at the watchdog's
        // deadline, and its communicators are aborted rather than left waiting.
        auto error =
            makeDistBackendError(info_.describe() + ": not completed within the timeout of " +
                                 std::to_string(limit.count()) + " ms");
        if (auto watchdog = watchdog_.lock()) {
          watchdog->breakGroup(info_, error);
        }
        std::rethrow_exception(error);
      }
    }
    // The caller's stream at the time of wait() joins the op; on CUDA the host goes on.
    if (joinOnWait_) {
      end_->block(device_->currentStream());
    }
    if (!captured_) {
      releaseIfCompleted();
    }
  }
  if (auto failure = outcome_->failure()) {
    std::rethrow_exception(failure);
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() { return outcome_->future(); }

std::optional<double> Work::durationMs() const {
  if (!start_ || !end_ || captured_) {
    return std::nullopt;
  }
  return end_->millisecondsSince(*start_);
}

float Work::getDuration() const {
  STREAMNCCL_CHECK_ARG(start_ && !captured_, info_.name,
                       "get_duration() needs timing, which is off for this op: create the group "
                       "with streamnccl.Options(enable_timing=True) or set "
                       "STREAMNCCL_ENABLE_TIMING=1",
                       captured_ ? " (an op captured into a CUDA graph is never timed)" : "");
  const auto duration = durationMs();
  STREAMNCCL_CHECK_ARG(
      duration, info_.name,
      "get_duration() is known once the op has completed (work.is_completed() is True)");
  return static_cast<float>(*duration);
}

int Work::sourceRank() const {
  STREAMNCCL_CHECK_ARG(sender_, info_.name,
                       "sourceRank() names the sender of a recv from any source only");
  const int sender = sender_->load();
  STREAMNCCL_CHECK_ARG(sender >= 0, info_.name,
                       "the sender is known once the recv has completed; wait() first");
  return sender;
}

bool Work::releaseIfCompleted() {
  if (!isCompleted()) {
    return false;
  }
  std::lock_guard<std::mutex> lock(inUseMutex_);
  inUse_.clear();
  return true;
}

}  // namespace streamnccl
