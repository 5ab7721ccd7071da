#pragma once

// What a group knows of its own failures: the first fault that broke it, and where the flight
// recorder goes when it breaks. Shared by the group, its watchdog and its ops' tasks, which
// may outlive the group by a moment.

#include "core/FlightRecorder.hpp"
#include "core/OpInfo.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace streamnccl {

class GroupHealth {
 public:
  // What broke the group, as c10d's Backend::getError() tells it: a deadline passed here
  // (TIMEOUT), another fault here (COMM_ERROR), or a break posted by another rank
  // (REMOTE_ERROR, BreakBoard.hpp).
  enum class Cause { Fault, Timeout, Remote };

  // Where the group's break is, one state at a time, each move in kMoves (asserted):
  // Healthy -> Claimed (claimBreak(): one caller makes the break's cause) -> Broken (breakWith():
  // later ops raise the cause) -> Evidenced (its log and dump written, or waited for as long as
  // anyone waits: callers that learn of the failure may read them). Never back: a broken group
  // stays broken.
  enum class State { Healthy, Claimed, Broken, Evidenced };
  static constexpr std::pair<State, State> kMoves[] = {
      {State::Healthy, State::Claimed},
      {State::Claimed, State::Broken},
      {State::Broken, State::Evidenced},
  };

  GroupHealth(size_t recorderCapacity, std::optional<std::string> dumpDir, int globalRank);

  FlightRecorder& recorder() { return FlightRecorder::instance(); }
  // The rank in the default group, which names this process's dump file.
  void setGlobalRank(int rank) { globalRank_.store(rank); }

  // Breaking the group is claimed first, by one caller (true for it alone), which may take a
  // while to make its cause (Watchdog::breakGroup's roll call) and then breaks the group with
  // breakWith(). The others wait for it with awaitBreak(): a fault met meanwhile is not the
  // group's first, whatever the order of their breakWith()s would have been.
  bool claimBreak();
  // The claimant's: marks the group broken by `error` (as `kind`), then logs the group's
  // latest ops and writes the flight recorder to <dump dir>/streamnccl_trace_rank_<global
  // rank>. `group` names the group and rank. Returns once the evidence is written (or 30 s
  // have passed: a file system that hangs delays the failures, it does not stop them): its
  // caller fails an op next, and whoever learns of that failure may read the dump.
  void breakWith(const OpInfo& group, std::exception_ptr error, Cause kind);
  // Returns once the claimant's breakWith() has (bounded as breakWith() is).
  void awaitBreak() const;
  // Cheap enough for every launch; raiseIfBroken() then says why.
  bool broken() const { return brokenFlag_.load(std::memory_order_acquire); }
  // SUCCESS until the group breaks, then its Cause's.
  c10d::ErrorType errorType() const;
  // Raises DistBackendError naming `op` and the original cause if the group is broken, once
  // the evidence of the break is written.
  void raiseIfBroken(const OpInfo& group, const char* op) const;

  // The dump file's name without the rank, as torchfrtrace's --prefix takes it.
  static constexpr const char* kDumpPrefix = "streamnccl_trace_rank_";

 private:
  const std::optional<std::string> dumpDir_;
  std::atomic<int> globalRank_;
  mutable std::mutex mutex_;
  mutable State state_ = State::Healthy;  // a waiter that gives up on the evidence moves it
  std::exception_ptr broken_;             // the cause, from Broken on
  // Waits (with `lock` on mutex_) until the evidence of the break is written.
  void awaitEvidence(std::unique_lock<std::mutex>& lock) const;
  // Writes `bytes`, the flight recorder's dump, to the dump folder; returns where it went, or
  // why not, for the log.
  std::string writeDump(std::string bytes) const;

  mutable std::condition_variable evidenceChanged_;
  // With mutex_ held: the state moves to `to`, a legal move.
  void moveTo(State to) const;
  std::atomic<bool> brokenFlag_{false};  // from Broken on: read by every launch without the lock
  std::string cause_;
  Cause kind_ = Cause::Fault;  // set with broken_
};

}  // namespace streamnccl
