#include "core/GroupHealth.hpp"

#include "core/Errors.hpp"
#include "core/StateMoves.hpp"

#include <c10/util/Logging.h>
#include <c10/util/thread_name.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

namespace streamnccl {
namespace {

constexpr auto kEvidenceWait = std::chrono::seconds(30);

}  // namespace

GroupHealth::GroupHealth(size_t recorderCapacity, std::optional<std::string> dumpDir,
                         int globalRank)
    : dumpDir_(std::move(dumpDir)), globalRank_(globalRank) {
  recorder().reserve(recorderCapacity);
}

void GroupHealth::moveTo(State to) const { moveState(state_, to, kMoves, "a group's health"); }

bool GroupHealth::claimBreak() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::Healthy) {
    return false;
  }
  moveTo(State::Claimed);
  return true;
}

void GroupHealth::awaitBreak() const {
  std::unique_lock<std::mutex> lock(mutex_);
  awaitEvidence(lock);
}

void GroupHealth::breakWith(const OpInfo& group, std::exception_ptr error, Cause kind) {
  std::string cause = "(its cause could not be described)";
  try {
    cause = describeException(error);
  } catch (...) {  // out of memory: the group must still move to Broken (see the header)
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    moveTo(State::Broken);  // asserts the claim
    broken_ = error;
    cause_ = cause;
    kind_ = kind;
    brokenFlag_.store(true, std::memory_order_release);
  }
  // Whatever becomes of the evidence, the callers waiting for it go on (see the header).
  struct Written {
    GroupHealth& health;
    ~Written() {
      {
        std::lock_guard<std::mutex> lock(health.mutex_);
        if (health.state_ == State::Broken) {  // else a waiter gave up on it first
          health.moveTo(State::Evidenced);
        }
      }
      health.evidenceChanged_.notify_all();
    }
  } written{*this};
  std::string where = "not written (set STREAMNCCL_DUMP_DIR or Options(dump_dir=...))";
  if (dumpDir_) {
    where = writeDump(recorder().dump());
  }
  LOG(ERROR) << group.who() << " group broken: " << cause << "; " << recorder().summary(group.group)
             << "; flight recorder " << where;
}

std::string GroupHealth::writeDump(std::string bytes) const {
  const std::string rank = std::to_string(globalRank_.load());
  const std::string path = *dumpDir_ + "/" + kDumpPrefix + rank;
  // Written whole under another name first, so that a reader never sees half a dump (a name
  // without the prefix: torchfrtrace reads every file whose name holds it).
  const std::string partial = *dumpDir_ + "/.writing_rank_" + rank;
  // On a thread of its own, waited for up to kEvidenceWait: the group's ops fail only once the
  // dump is written, and a file system that hangs must not keep them from failing for ever.
  struct Outcome {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<std::string> where;
  };
  auto outcome = std::make_shared<Outcome>();
  std::thread([outcome, bytes = std::move(bytes), path, partial] {
    c10::setThreadName("streamnccl-dump");
    // One writer at a time: every group of this process dumps under the same names (they hold
    // the same, process-wide recorder), and a writer may outlive the wait for it.
    static auto* oneWriter = new std::mutex();  // never destroyed: writers may outlive exit
    std::string where;
    {
      std::lock_guard<std::mutex> writing(*oneWriter);
      {
        std::ofstream file(partial, std::ios::binary);
        file << bytes;
      }
      where = std::rename(partial.c_str(), path.c_str()) == 0 ? path
                                                              : "could not be written to " + path;
    }
    {
      std::lock_guard<std::mutex> lock(outcome->mutex);
      outcome->where = std::move(where);
    }
    outcome->done.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(outcome->mutex);
  if (!outcome->done.wait_for(lock, kEvidenceWait, [&] { return outcome->where.has_value(); })) {
    return "still being written to " + path + " after " +
           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kEvidenceWait).count()) +
           " s (the ops fail without waiting longer)";
  }
  return *outcome->where;
}

void GroupHealth::awaitEvidence(std::unique_lock<std::mutex>& lock) const {
  // Bounded: a dump that cannot be written within it (a hung file system) is reported by its
  // writer, and nobody waits for it again.
  if (!evidenceChanged_.wait_for(lock, kEvidenceWait, [&] { return state_ == State::Evidenced; }) &&
      state_ == State::Broken) {
    moveTo(State::Evidenced);
  }
}

c10d::ErrorType GroupHealth::errorType() const {
  if (!broken()) {
    return c10d::ErrorType::SUCCESS;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  switch (kind_) {
    case Cause::Timeout:
      return c10d::ErrorType::TIMEOUT;
    case Cause::Remote:
      return c10d::ErrorType::REMOTE_ERROR;
    case Cause::Fault:
      break;
  }
  return c10d::ErrorType::COMM_ERROR;
}

void GroupHealth::raiseIfBroken(const OpInfo& group, const char* op) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (broken_) {
    awaitEvidence(lock);  // the caller learns of the failure: its dump is there to read
    throwDistBackendError(group.who() + " " + op +
                          ": the group is unusable since an earlier failure: " + cause_);
  }
}

}  // namespace streamnccl
