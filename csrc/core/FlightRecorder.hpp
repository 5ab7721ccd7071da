#pragma once

// The latest ops of every streamnccl group in this process, and what became of each: the
// evidence of where a job stopped. One recorder per process, as torch's own: a rank's dump
// holds all of its groups, so that `torchfrtrace DIR` (torch.distributed.flight_recorder)
// can match each collective across the ranks' dumps and name the rank that went astray.
//
// The dump is written in the format of torch's c10d::FlightRecorder (a pickled dict, version
// "2.10"), which the analyzer reads. torch's recorder itself cannot be shared: its singleton
// and event timing are not exported by libtorch. Every op is named "nccl:<op>" as
// ProcessGroupNCCL names it, on the host path too: the analyzer accepts no other prefix.

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace streamnccl {

// What a dump says of a group: its name (c10d's group name, the key the analyzer matches
// groups on), its description ("default_pg", ...) and the global ranks of its members.
struct RecordedGroup {
  int64_t uid = 0;  // this process's count of groups, as torch's pg_id
  std::string name;
  std::string desc;
  std::vector<int> globalRanks;
};

// What is known of an op when it is launched, besides its tensors.
struct RecordedOp {
  std::string profilingName;  // "nccl:all_reduce", "nccl:send 0->1", "nccl:recv 1<-0"
  bool p2p = false;
  uint64_t collectiveSeq = 0;
  uint64_t p2pSeq = 0;
  uint64_t opId = 0;
  std::chrono::milliseconds timeout{0};
};

// The recorder's clock, read at most once for what one caller records at one moment: a launch
// that retires the ops ended before it and records itself reads it once, not for each, and not
// at all when nothing is recorded.
class RecorderClock {
 public:
  int64_t nowNs();
  // Read afresh at the next nowNs(): what came since took long (a fault was handled).
  void reset() { ns_ = 0; }

 private:
  int64_t ns_ = 0;
};

class FlightRecorder {
 public:
  static FlightRecorder& instance();

  // Keeps at least the latest `capacity` ops (the most any group asked for); 0 records none.
  void reserve(size_t capacity);
  bool enabled() const;

  // The op was launched; returns its record id, or -1 when nothing is recorded. On the launch
  // path: an entry reuses the memory of the one it replaces in the ring.
  int64_t record(const std::shared_ptr<const RecordedGroup>& group, RecordedOp op,
                 const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                 RecorderClock& clock);
  // Its work began on its stream (the host: the worker took it up; CUDA: it was issued).
  void started(int64_t id);
  // It ended: completed, or failed with `error`; `durationMs` when it was timed.
  void completed(int64_t id, std::optional<double> durationMs, RecorderClock& clock);
  void failed(int64_t id, const std::string& error);

  // The whole recorder as torch's flight recorder pickles it.
  std::string dump() const;
  // One line for the log: the last few ops of the group named `groupName` and their states.
  std::string summary(const std::string& groupName) const;

 private:
  enum class State { Scheduled, Started, Completed };
  struct Tensors {
    std::vector<std::vector<int64_t>> sizes;
    std::vector<c10::ScalarType> dtypes;
    void assign(const std::vector<at::Tensor>& tensors);
  };
  struct Entry {
    int64_t id = -1;
    std::shared_ptr<const RecordedGroup> group;
    RecordedOp op;
    Tensors inputs;
    Tensors outputs;
    State state = State::Scheduled;
    bool retired = false;
    int64_t createdNs = 0;
    int64_t startedNs = 0;
    int64_t completedNs = 0;
    std::optional<double> durationMs;
    std::string error;
  };
  // The entry of `id` if it is still kept (the buffer is a ring); the caller holds mutex_.
  Entry* find(int64_t id);
  // The kept entries of the group named `groupName` (every group's when null), oldest first;
  // the caller holds mutex_.
  std::vector<const Entry*> kept(const std::string* groupName) const;
  // "scheduled", "started" or "completed", as torch's recorder names the states.
  static const char* stateName(State state);
  // One entry as torch's flight recorder writes it (dump()).
  static c10::Dict<c10::IValue, c10::IValue> asDict(const Entry& entry);

  std::atomic<bool> enabled_{false};  // read by every launch: no lock
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  int64_t nextId_ = 0;
  // Every group ever recorded, for pg_config: the analyzer needs the groups of old entries.
  std::vector<std::shared_ptr<const RecordedGroup>> groups_;
};

}  // namespace streamnccl
