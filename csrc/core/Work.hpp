#pragma once

#include "core/Device.hpp"
#include "core/OpInfo.hpp"
#include "core/StateMoves.hpp"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace streamnccl {

class Communicator;

class InflightWriteCheck;
class Work;

// What an op's Work asks of the watchdog that tracks it (Watchdog implements it): the Work,
// which the watchdog holds, knows it only through this.
class WorkWatcher {
 public:
  // A caller met a device error, `cause`, looking at `work`: the group breaks with it, and the
  // op fails once the dump is written.
  virtual void failOnDeviceError(Work& work, std::exception_ptr cause) = 0;
  // A wait(timeout) on the op `op` expired: the group breaks with `error`, as at the deadline.
  virtual void breakOnWaitTimeout(const OpInfo& op, std::exception_ptr error) = 0;

 protected:
  ~WorkWatcher() = default;
};

// The value type of every op's future, a list of tensors. Made once: making it is a shared
// allocation, per op.
const c10::TypePtr& tensorListType();

// The handle c10d returns to Python for one op. See the stream contract in Device.hpp for
// what wait() does, and what the Work holds for how long (rule 5).
//
// It is also the op's outcome, which its task settles: the task holds the Work until it has
// run, whatever the caller drops, so that one object per op carries its description, its end
// and its future (one allocation, where apart they were three).
class Work : public c10d::Work {
 public:
  // `watchdog`: the group's, which a wait(timeout) that expires breaks. `future`: one handed
  // out before the op was issued (a coalesced group's, a captured op's), which the op
  // completes; otherwise the future is made when first asked for (getFuture()): most ops are
  // waited on and never asked, and a future completed for each costs three allocations and
  // its completion on the launch path. One asked for after the op settled follows the op's
  // end event (Device::completedFuture), not what its stream has run since.
  Work(OpInfo info, c10d::OpType opType, std::shared_ptr<Device> device,
       std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout, bool blockHostOnWait,
       std::weak_ptr<WorkWatcher> watchdog, c10::intrusive_ptr<c10::ivalue::Future> future);

  // Called by the task once it has issued the op's work, its own kernels included; on CUDA with
  // the op's stream current, so that a future already asked for follows the whole op.
  void succeed();
  // Fails the op with `cause`, from its task or from outside it (the watchdog at the deadline,
  // the group breaking, a device error). Whichever of succeed() and fail() comes first settles
  // the future; a later fail() still records its error if none was.
  void fail(std::exception_ptr cause);
  void fail(const std::string& reason);
  // The error fail(cause) gives the op, made without failing it: the flight recorder and the
  // group's dump hold it before anyone can learn of the failure (Watchdog::breakGroup).
  std::exception_ptr failureFor(std::exception_ptr cause) const;

  // The event after the op on `stream`, and every tensor the op touches, held until that
  // event has passed. `joinOnWait`: wait() makes the caller's stream wait for `end` (async
  // ops); a sync op's `end` is on the caller's stream already, and only watched.
  void setEnd(c10::Stream stream, std::unique_ptr<Event> end, std::vector<at::Tensor> inUse,
              bool joinOnWait);
  // Where the op's end is: its device, and its stream once setEnd has named it (none for an op
  // that failed at its launch). Ops on one stream end in the order they were enqueued
  // (OpsInFlight::Look).
  struct EndStream {
    const Device* device;
    std::optional<c10::Stream> stream;
    bool operator==(const EndStream&) const = default;
  };
  EndStream endStream() const { return {device_.get(), endStream_}; }
  // A timed op (Options::enableTiming): the event before it on its stream; `end` then times
  // against it.
  void setStart(std::unique_ptr<Event> start) { start_ = std::move(start); }
  // The op was captured into a CUDA graph: it runs at each replay, so its events cannot be
  // queried and the host has nothing to wait for. Its tensors, and `temporaries` (what its
  // kernels use besides them), are held until wait() has joined it to the caller's stream.
  void markCaptured(std::shared_ptr<const void> temporaries);
  bool captured() const { return captured_; }
  // The communicator the op was issued on (a group's split waits for the ops on the ones it
  // splits); null where none was chosen.
  void setCommunicator(const Communicator* communicator) { communicator_ = communicator; }
  const Communicator* communicator() const { return communicator_; }
  // Options::checkInflightWrites: wait() raises if a tensor of the op was written while it was
  // in flight (InflightWrites.hpp).
  void checkWrites(std::shared_ptr<InflightWriteCheck> writes) { writes_ = std::move(writes); }

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Makes the caller's current stream wait for the op (the host goes on), and takes the op out
  // of torch's registry of ops in flight (allow_inflight_collective_as_graph_input), as
  // ProcessGroupNCCL's Work does.
  void synchronize() override;
  // The same as synchronize(), as ProcessGroupNCCL's Work does: c10d's default would launch a
  // kernel released by the future's completion, and this future completes at issue.
  void blockCurrentStream() override { synchronize(); }
  // Takes the op out of torch's registry of ops in flight, where it is registered.
  void forgetInTorch();
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // Whether wait(timeout) returns at once: a sync op's plain wait(), which reports what is known
  // of the op and touches neither its device nor a lock held while the GIL is needed. Python's
  // wait() then keeps the GIL: releasing and taking it back costs more than such a wait.
  bool waitReturnsAtOnce(std::chrono::milliseconds timeout) const;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return info_.seq; }
  // When the op was issued, for completion hooks (noted only while some are registered).
  void noteIssued(std::chrono::steady_clock::time_point at) { issuedAt_ = at; }
  std::chrono::steady_clock::time_point issuedAt() const { return issuedAt_; }
  // Milliseconds from the op's start to its end on its stream; raises unless the op is timed
  // and has completed.
  float getDuration() const override;
  // The same, or nullopt where getDuration() raises. A device error reading the times raises.
  std::optional<double> durationMs() const;
  // True on the first call only: an op's end is counted once (stats, flight recorder).
  bool markRetired() { return !retired_.exchange(true); }
  // A recv from any source: the sender, once the op has completed.
  int sourceRank() const override;
  void reportSourceRank(std::shared_ptr<const std::atomic<int>> sender) {
    sender_ = std::move(sender);
  }

  // What a look at the op's `end` found. Never throws and never runs callbacks (the watchdog
  // calls it with its lock held): a device error querying the event (a CUDA error: the
  // device can run nothing more) counts as the end, and is kept for failWithDeviceError().
  // It is also the op's end's lifecycle (endState_): Pending -> Passed | DeviceError, and
  // Passed -> DeviceError where a concurrent look met the device's error (which wins: the device
  // can run nothing more).
  enum class EndState : uint8_t { Pending, Passed, DeviceError };
  static constexpr std::pair<EndState, EndState> kEndMoves[] = {
      {EndState::Pending, EndState::Passed},
      {EndState::Pending, EndState::DeviceError},
      {EndState::Passed, EndState::DeviceError},
  };
  EndState pollEnd();
  // Whether the op's start event has passed (a timed op on a device whose tasks run before
  // their ops start): the flight recorder then marks it started. Never throws.
  bool pollStarted();
  // Fails the op with the device error pollEnd() found, if it has not failed already.
  void failWithDeviceError();
  std::exception_ptr deviceError() const;
  // Lets go of the tensors (and temporaries) held for the op. Only once its end has passed,
  // or, captured, once wait() has joined it.
  void releaseTensors();
  // Whether a captured op has been joined by wait(), after which nothing of it is held.
  bool joined() const { return joined_.load(); }
  const OpInfo& info() const { return info_; }
  Device& device() const { return *device_; }
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Whether the op's timeout has passed by `now`, counted from the first time the watchdog
  // asks (within one of its periods of the launch), so that the launch does not read the clock.
  // Called by the watchdog only, with its lock held.
  bool expiredBy(std::chrono::steady_clock::time_point now) {
    if (!deadline_) {
      deadline_ = now + timeout_;
    }
    return now > *deadline_;
  }

 private:
  // A device error met by wait() looking at the op (pollEnd() found one, or a CUDA call
  // failed): the group breaks with it, and the op fails with `cause` once the group's dump is
  // written (Watchdog::failOnDeviceError).
  void reportDeviceError(std::exception_ptr cause);
  // The caller's current stream joins the op (`end`); refused, with a clear error, where CUDA
  // would refuse it (a capture waiting on work recorded outside it).
  void joinCurrentStream();
  // Refuses a wait() on this op from a stream being captured, unless the op is captured too.
  void refuseWaitInsideCapture(const c10::Stream& current);
  // Blocks the host until `end` has passed or the op has failed (true), or `limit` passes.
  bool waitForEnd(std::chrono::milliseconds limit);
  // The same, without a limit.
  void waitForEndOrFailure();
  // wait()'s steps; raises the op's failure, and whatever the device raised.
  void waitOrRaise(std::chrono::milliseconds timeout);
  // Whether wait(timeout) queries the op's end (see waitOrRaise()).
  bool waitLooksAtEnd(std::chrono::milliseconds timeout) const;

  const OpInfo info_;
  const std::shared_ptr<Device> device_;
  const std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point issuedAt_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;  // see expiredBy()
  const bool blockHostOnWait_;
  const std::weak_ptr<WorkWatcher> watchdog_;
  bool captured_ = false;
  const Communicator* communicator_ = nullptr;

  std::shared_ptr<const std::atomic<int>> sender_;  // set for a recv from any source
  std::shared_ptr<InflightWriteCheck> writes_;      // set when in-flight writes are checked

  std::unique_ptr<Event> start_;
  std::unique_ptr<Event> end_;
  std::optional<c10::Stream> endStream_;
  bool joinOnWait_ = true;
  // The op's two lifecycles, each one state: its end on the device (EndState, pollEnd(); a
  // DeviceError's error is deviceError_), and its outcome on the host (Outcome: settled by
  // whichever of succeed() and fail() comes first; a fail() after a success still records its
  // error, for exception(), but does not change how the op settled). Their moves are the tables
  // kEndMoves and kOutcomeMoves, checked at compile time where the code moves them.
  enum class Outcome : uint8_t { Pending, Succeeded, Failed, FailedAfterSuccess };
  static constexpr std::pair<Outcome, Outcome> kOutcomeMoves[] = {
      {Outcome::Pending, Outcome::Succeeded},
      {Outcome::Pending, Outcome::Failed},
      {Outcome::Succeeded, Outcome::FailedAfterSuccess},
  };
  // The moves Work.cpp makes with compare-and-swap, each checked against its table.
  static_assert(legalMove(kOutcomeMoves, Outcome::Pending, Outcome::Succeeded));
  static_assert(legalMove(kOutcomeMoves, Outcome::Pending, Outcome::Failed));
  static_assert(legalMove(kOutcomeMoves, Outcome::Succeeded, Outcome::FailedAfterSuccess));
  static_assert(legalMove(kEndMoves, EndState::Pending, EndState::Passed));
  static_assert(legalMove(kEndMoves, EndState::Pending, EndState::DeviceError));
  static_assert(legalMove(kEndMoves, EndState::Passed, EndState::DeviceError));
  std::atomic<EndState> endState_{EndState::Pending};
  // Moved with mutex_ held, but by succeed(): read after every op, without the lock.
  std::atomic<Outcome> outcome_{Outcome::Pending};
  // Once-only observations, not states: the start seen (flight recorder), the end counted, a
  // captured op joined, tensors given to hold (setEnd, markCaptured).
  std::atomic<bool> started_{false};
  std::atomic<bool> retired_{false};
  std::atomic<bool> joined_{false};
  std::atomic<bool> holding_{false};
  // A future was handed out, or asked for (getFuture()): succeed() then looks for it.
  std::atomic<bool> futureAsked_;
  mutable std::mutex mutex_;    // guards what follows
  std::exception_ptr failure_;  // the first failure, even one after a success (see Outcome)
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> inUse_;
  std::shared_ptr<const void> temporaries_;
  std::exception_ptr deviceError_;
};

}  // namespace streamnccl
