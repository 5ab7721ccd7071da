#pragma once

// The last ops of a group and what became of each, kept so that when the group fails there is
// evidence of where: which op was stuck, what came before, how long each took. Dumped as JSON
// (and summarized in the log) when the group breaks.

#include "core/OpInfo.hpp"

#include <chrono>
#include <deque>
#include <mutex>
#include <string>

namespace streamnccl {

class FlightRecorder {
 public:
  enum class State { Queued, Started, Completed, Failed };

  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}

  // An op was launched; the oldest record goes once there are `capacity` of them.
  void queued(const OpInfo& info);
  void started(uint64_t seq);
  void completed(uint64_t seq);
  void failed(uint64_t seq, const std::string& error);

  // Every record, oldest first, with `cause` (why the group broke) and who is dumping.
  std::string toJson(const OpInfo& group, const std::string& cause) const;
  // One line: the last few ops and their states.
  std::string summary() const;

 private:
  struct Record {
    OpInfo info;
    State state = State::Queued;
    std::chrono::steady_clock::time_point queuedAt;
    std::chrono::steady_clock::time_point startedAt;
    std::chrono::steady_clock::time_point endedAt;
    std::string error;
  };
  Record* find(uint64_t seq);

  const size_t capacity_;
  const std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;
  std::deque<Record> records_;
};

}  // namespace streamnccl
