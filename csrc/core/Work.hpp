#pragma once

#include "core/Device.hpp"
#include "core/OpInfo.hpp"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace streamnccl {

class Watchdog;

// The outcome of one op, shared by its Work and by the task that runs it: the task may
// outlive the Work (the caller dropped it) and the Work the task.
class OpOutcome {
 public:
  OpOutcome(at::TypePtr valueType, std::vector<c10::Device> futureDevices);

  // Called by the task once it has issued the op's work: marks the future completed (on CUDA
  // with the op's stream current, so the future's events follow the op).
  void succeed(const std::vector<at::Tensor>& outputs);
  void fail(const OpInfo& info, std::exception_ptr cause);
  // Whichever of succeed() and fail() comes first settles the future; a later fail() (the
  // watchdog's, then the task's own) still records its error if none was.

  // The DistBackendError the op failed with, or null.
  std::exception_ptr failure() const;
  const c10::intrusive_ptr<c10::ivalue::Future>& future() const { return future_; }

 private:
  mutable std::mutex mutex_;
  std::exception_ptr failure_;
  std::atomic<bool> settled_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The handle c10d returns to Python for one op. See the stream contract in Device.hpp for
// what wait() does.
class Work : public c10d::Work {
 public:
  // `watchdog`: the group's, which a wait(timeout) that expires breaks.
  Work(OpInfo info, c10d::OpType opType, std::shared_ptr<Device> device,
       std::shared_ptr<OpOutcome> outcome, std::vector<at::Tensor> outputs,
       std::chrono::milliseconds timeout, bool blockHostOnWait, std::weak_ptr<Watchdog> watchdog);

  // The event after the op on its stream, and every tensor the op touches, held until that
  // event has completed. `joinOnWait`: wait() makes the caller's stream wait for `end`
  // (async ops); a sync op's `end` is on the caller's stream already, and only watched.
  void setEnd(std::unique_ptr<Event> end, std::vector<at::Tensor> inUse, bool joinOnWait);
  // A timed op (Options::enableTiming): the event before it on its stream; `end` then times
  // against it.
  void setStart(std::unique_ptr<Event> start) { start_ = std::move(start); }
  // The op was captured into a CUDA graph: it runs at each replay, so the host has nothing to
  // wait for and its events cannot be queried; wait() only joins the caller's stream.
  void markCaptured() { captured_ = true; }

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return info_.seq; }
  // Milliseconds from the op's start to its end on its stream; raises unless the op is timed
  // and has completed.
  float getDuration() const override;
  // The same, or nullopt where getDuration() raises.
  std::optional<double> durationMs() const;
  // True on the first call only: an op's end is counted once (stats, flight recorder).
  bool markRetired() { return !retired_.exchange(true); }
  // A recv from any source: the sender, once the op has completed.
  int sourceRank() const override;
  void reportSourceRank(std::shared_ptr<const std::atomic<int>> sender) {
    sender_ = std::move(sender);
  }

  // Drops the tensors held for the op if it has completed; true if it has.
  bool releaseIfCompleted();
  // Fails the op from outside its task (the watchdog, at the deadline).
  void fail(const std::string& reason);
  const OpInfo& info() const { return info_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }

 private:
  const OpInfo info_;
  const std::shared_ptr<Device> device_;
  const std::shared_ptr<OpOutcome> outcome_;
  const std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::steady_clock::time_point deadline_;
  const bool blockHostOnWait_;
  const std::weak_ptr<Watchdog> watchdog_;
  bool captured_ = false;

  std::shared_ptr<const std::atomic<int>> sender_;  // set for a recv from any source

  std::unique_ptr<Event> start_;
  std::unique_ptr<Event> end_;
  bool joinOnWait_ = true;
  std::atomic<bool> retired_{false};
  std::mutex inUseMutex_;
  std::vector<at::Tensor> inUse_;
};

}  // namespace streamnccl
