#include "core/Work.hpp"

#include "core/Errors.hpp"
#include "core/InflightWrites.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace streamnccl {

const c10::TypePtr& tensorListType() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return type;
}

Work::Work(OpInfo info, c10d::OpType opType, std::shared_ptr<Device> device,
           std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout, bool blockHostOnWait,
           std::weak_ptr<WorkWatcher> watchdog, c10::intrusive_ptr<c10::ivalue::Future> future)
    : c10d::Work(info.rank, opType),
      info_(std::move(info)),
      device_(std::move(device)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      blockHostOnWait_(blockHostOnWait),
      watchdog_(std::move(watchdog)),
      futureAsked_(future != nullptr),
      future_(std::move(future)) {}

void Work::succeed() {
  Outcome pending = Outcome::Pending;
  if (!outcome_.compare_exchange_strong(pending, Outcome::Succeeded)) {
    return;
  }
  // Most ops' futures are never asked for: then no lock. getFuture() notes the ask before it
  // reads outcome_, and this reads the note after settling (both sequentially consistent), so
  // either it sees this op settled and makes its future completed, or this sees the ask and,
  // under the lock the ask holds while it makes the future, completes that future.
  if (!futureAsked_.load()) {
    return;
  }
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    future = future_;
  }
  // Outside the lock: completing runs the future's callbacks. One made completed by a
  // getFuture() that saw this op settled is left as it is.
  if (future && !future->completed()) {
    future->markCompleted(c10::IValue(outputs_));
  }
}

std::exception_ptr Work::failureFor(std::exception_ptr cause) const {
  return makeDistBackendError(info_.describe() + ": " + describeException(cause));
}

void Work::fail(std::exception_ptr cause) {
  auto error = failureFor(cause);
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // fail() is the only mover out of Succeeded
    Outcome seen = Outcome::Pending;
    if (!outcome_.compare_exchange_strong(seen, Outcome::Failed)) {
      if (seen == Outcome::Succeeded) {  // recorded for exception(), not for the future
        failure_ = error;
        outcome_.store(Outcome::FailedAfterSuccess);
      }
      return;  // already failed: the first failure stays
    }
    failure_ = error;  // before the lock goes: exception() takes it once it sees the failure
    future = future_;
  }
  if (future) {
    future->setError(error);
  }
}

void Work::fail(const std::string& reason) {
  fail(std::make_exception_ptr(std::runtime_error(reason)));
}

std::exception_ptr Work::exception() const {
  const Outcome outcome = outcome_.load(std::memory_order_acquire);
  if (outcome != Outcome::Failed && outcome != Outcome::FailedAfterSuccess) {
    return nullptr;  // asked after every op: no lock to say so
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void Work::setEnd(c10::Stream stream, std::unique_ptr<Event> end, std::vector<at::Tensor> inUse,
                  bool joinOnWait) {
  endStream_ = stream;
  end_ = std::move(end);
  joinOnWait_ = joinOnWait;
  if (inUse.empty()) {
    return;  // a sync op: nothing to hold, nor a lock to take for it
  }
  std::lock_guard<std::mutex> lock(mutex_);
  inUse_ = std::move(inUse);
  holding_.store(true, std::memory_order_release);
}

void Work::markCaptured(std::shared_ptr<const void> temporaries) {
  captured_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  temporaries_ = std::move(temporaries);
  holding_.store(true, std::memory_order_release);
}

Work::EndState Work::pollEnd() {
  if (const EndState state = endState_.load(std::memory_order_acquire);
      state != EndState::Pending) {
    return state;
  }
  EndState seen = EndState::Pending;
  try {
    if (end_ != nullptr && !end_->query()) {
      return EndState::Pending;
    }
    endState_.compare_exchange_strong(seen, EndState::Passed);  // or another poll's, first
    return endState_.load();
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);  // deviceError() takes it once it sees the state
    // Even over a concurrent poll's Passed: the device can run nothing more, and the op's
    // error says so.
    if (endState_.load() != EndState::DeviceError) {
      deviceError_ = std::current_exception();
      endState_.store(EndState::DeviceError, std::memory_order_release);
    }
    return EndState::DeviceError;
  }
}

bool Work::pollStarted() {
  if (started_.load() || start_ == nullptr) {
    return false;
  }
  try {
    if (!start_->query()) {
      return false;
    }
  } catch (...) {
    return false;  // the end's query reports the device's error
  }
  return !started_.exchange(true);
}

std::exception_ptr Work::deviceError() const {
  if (endState_.load(std::memory_order_acquire) != EndState::DeviceError) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return deviceError_;
}

void Work::reportDeviceError(std::exception_ptr cause) {
  if (auto watchdog = watchdog_.lock()) {
    watchdog->failOnDeviceError(*this, cause);
  } else {
    fail(cause);  // the group is gone: nobody else to tell
  }
}

void Work::failWithDeviceError() {
  if (auto error = deviceError()) {
    fail(error);
  }
}

bool Work::isCompleted() {
  if (captured_) {
    return true;
  }
  const EndState state = pollEnd();
  if (state == EndState::DeviceError && !exception()) {
    if (!watchdog_.expired()) {
      // The watchdog fails it within a period, once the group's dump is written: this call
      // (Python holds the GIL through it) must not wait for the dump, as wait() may.
      return false;
    }
    failWithDeviceError();  // the group is gone: nobody else will
  }
  if (state != EndState::Pending && writes_) {
    writes_->noteCompletionVisible();  // a write after this may have followed it
  }
  return state != EndState::Pending;
}

bool Work::isSuccess() const { return exception() == nullptr; }

std::vector<at::Tensor> Work::result() { return outputs_; }

void Work::refuseWaitInsideCapture(const c10::Stream& current) {
  // CUDA refuses a captured stream's wait on an event recorded outside the capture
  // (cudaErrorStreamCaptureIsolation), and the thread may not query events then: say what to
  // do instead.
  STREAMNCCL_CHECK_ARG(captured_ || !device_->isCapturing(current), info_.name, "wait() on op #",
                       info_.seq,
                       " inside a CUDA graph capture, but the op was launched before the "
                       "capture began: a captured stream cannot wait for work outside the graph "
                       "(cudaErrorStreamCaptureIsolation); wait() for it before the capture");
}

void Work::joinCurrentStream() {
  if (!end_ || !joinOnWait_) {
    return;
  }
  const c10::Stream current = device_->currentStream();
  refuseWaitInsideCapture(current);
  end_->block(current);
}

void Work::synchronize() {
  joinCurrentStream();
  if (captured_) {
    joined_.store(true);
    releaseTensors();
  } else if (holding_.load(std::memory_order_acquire) && pollEnd() == EndState::Passed) {
    releaseTensors();
  }
  forgetInTorch();
}

void Work::forgetInTorch() {
  if (c10d::allow_inflight_collective_as_graph_input()) {
    // Registered by c10d's op under that context; the waiter is done with it.
    c10d::unregister_work(c10::intrusive_ptr<Work>::unsafe_reclaim_from_nonowning(this));
  }
}

bool Work::wait(std::chrono::milliseconds timeout) {
  try {
    waitOrRaise(timeout);
  } catch (const c10::ValueError&) {
    throw;  // a wait() CUDA would refuse (refuseWaitInsideCapture)
  } catch (const c10::DistError&) {
    throw;  // the op's failure, or its timeout
  } catch (const c10::Error&) {
    // A CUDA error on the way (a sticky one fails every call): the op's device failed.
    reportDeviceError(std::current_exception());
    std::rethrow_exception(exception());
  }
  // Outside the try: a write found is the caller's error, not the device's.
  if (writes_) {
    writes_->judgeAtWait();
  }
  return true;
}

bool Work::waitLooksAtEnd(std::chrono::milliseconds timeout) const {
  // A sync op's plain wait() has nothing to join nor to let go of: it reports what is known of
  // the op, without a look at its end event (a device call on every op, where
  // ProcessGroupNCCL's wait() makes none either); the watchdog and the next launch look.
  return joinOnWait_ || holding_.load(std::memory_order_acquire) || blockHostOnWait_ ||
         timeout != kNoTimeout;
}

bool Work::waitReturnsAtOnce(std::chrono::milliseconds timeout) const {
  // What waitOrRaise() does for such an op: neither a look at its end nor a join; exception()
  // takes a lock only where the op failed, and fail() never holds it while running callbacks.
  return !waitLooksAtEnd(timeout) && !captured_ && !writes_;
}

void Work::waitOrRaise(std::chrono::milliseconds timeout) {
  const bool looksAtEnd = waitLooksAtEnd(timeout);
  if (!captured_ && looksAtEnd) {
    if (end_ && joinOnWait_) {
      refuseWaitInsideCapture(device_->currentStream());  // before any query of its events
    }
    if (pollEnd() == EndState::DeviceError) {
      // The device failed (a CUDA error looking at the op): nothing more is issued to it.
      reportDeviceError(deviceError());
      std::rethrow_exception(exception());
    }
  }
  if (end_ && !captured_ && timeout == kNoTimeout && !blockHostOnWait_ && joinOnWait_ &&
      device_->joinBlocksCaller()) {
    // Joining would hold the caller until the op's end: waited for so that a failure meanwhile
    // (the group's break, learned from another rank) is raised at once, below.
    waitForEndOrFailure();
  }
  if (end_ && !captured_ && (blockHostOnWait_ || timeout != kNoTimeout)) {
    const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
    if (!waitForEnd(limit)) {
      // The ranks are no longer known to be in step: the group breaks, as at the watchdog's
      // deadline, and its communicators are aborted rather than left waiting.
      auto error =
          makeDistBackendError(info_.describe() + ": not completed within the timeout of " +
                               std::to_string(limit.count()) + " ms");
      if (auto watchdog = watchdog_.lock()) {
        watchdog->breakOnWaitTimeout(info_, error);
      }
      std::rethrow_exception(error);
    }
  }
  if (auto failure = exception(); failure && device_->joinBlocksCaller()) {
    // Raised without joining the op: on the host path, a Gloo exchange whose peer never comes
    // returns only at Gloo's own timeout, and the caller must learn of the failure (the group's
    // break, at once) now. Its tensors are still held until its end (the watchdog's). On CUDA
    // the join below costs the host nothing, and orders the caller's stream after the kernels
    // that still run after an abort (copy-backs into the outputs).
    forgetInTorch();
    std::rethrow_exception(failure);
  }
  // The caller's stream at the time of wait() joins the op; on CUDA the host goes on. The
  // tensors go only once the op's end has passed: until then its kernels may still use them.
  // A captured op's go once joined: later work on the caller's stream, in the graph too, then
  // runs after the op.
  synchronize();
  if (auto failure = exception()) {
    std::rethrow_exception(failure);
  }
}

void Work::waitForEndOrFailure() {
  constexpr auto kSlice = std::chrono::milliseconds(10);
  while (!end_->waitHelping(kSlice) && !exception()) {
  }
}

bool Work::waitForEnd(std::chrono::milliseconds limit) {
  // In slices: an op that failed meanwhile (the watchdog's deadline, the group breaking) is
  // reported at once, rather than after its end, which a stuck peer may never let pass.
  const auto deadline = std::chrono::steady_clock::now() + limit;
  constexpr auto kSlice = std::chrono::milliseconds(10);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (end_->synchronize(std::max(std::chrono::milliseconds(0), std::min(left, kSlice))) ||
        exception()) {
      return true;
    }
    if (left <= std::chrono::milliseconds(0)) {
      return false;
    }
  }
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() {
  if (writes_) {
    // Its then() callbacks and wait() see the op complete: writes after that are the caller's
    // to make (DDP's comm hooks write the result in one).
    writes_->noteCompletionVisible();
  }
  std::exception_ptr settledWith;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (future_) {
      return future_;
    }
    futureAsked_.store(true);  // before outcome_ is read: see succeed()
    const Outcome outcome = outcome_.load();
    if (outcome == Outcome::Pending) {  // the op's settling completes it
      future_ =
          c10::make_intrusive<c10::ivalue::Future>(tensorListType(), device_->futureDevices());
      return future_;
    }
    settledWith = outcome == Outcome::Failed ? failure_ : nullptr;
  }
  // Settled already: made outside the lock (on CUDA, completing it issues device calls), as
  // the op settled; a failure after a success does not change it.
  c10::intrusive_ptr<c10::ivalue::Future> future;
  if (!settledWith && end_) {
    try {
      future = device_->completedFuture(*end_, tensorListType(), c10::IValue(outputs_));
    } catch (const c10::Error&) {
      // A CUDA error on the way (a sticky one fails every call): the op's device failed, as a
      // wait() would report it. Failed here, not through the group as wait() does: this call
      // holds the GIL, and must not wait for the group's dump.
      fail(std::current_exception());
      settledWith = exception();
    }
  }
  if (!future) {
    future = c10::make_intrusive<c10::ivalue::Future>(tensorListType(), device_->futureDevices());
    if (settledWith) {
      future->setError(settledWith);
    } else {
      future->markCompleted(c10::IValue(outputs_));  // no end to follow: nothing on a device
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!future_) {  // another thread asking at the same time made one first: that one it is
    future_ = std::move(future);
  }
  return future_;
}

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

void Work::releaseTensors() {
  // Set before the Work is shared with other threads: a sync op, which holds nothing, takes
  // no lock here (called at its wait() and again at its retirement).
  if (!holding_.load(std::memory_order_acquire)) {
    return;
  }
  std::vector<at::Tensor> tensors;
  std::shared_ptr<const void> temporaries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tensors.swap(inUse_);
    temporaries.swap(temporaries_);
  }
  // Dropped here, outside the lock: a tensor's last reference may run a Python deleter.
}

}  // namespace streamnccl
