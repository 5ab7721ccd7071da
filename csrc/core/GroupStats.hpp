#pragma once

// How much of a group's time and traffic went to each kind of op: counts, bytes, failures and
// ops in flight, and with timing on, durations. The launch path only adds to atomics; the
// durations are kept when ops end, on the watchdog's or a caller's thread.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

namespace streamnccl {

// The name an op kind has in stats and in the flight recorder, as ProcessGroupNCCL names it
// ("all_reduce", "_all_gather_base", "send", ...).
const char* opKindName(c10d::OpType opType);

class GroupStats {
 public:
  // An op of `opType` moving `bytes` (the larger of its input and output on this rank, as
  // nccl-tests counts a message) was launched; `tracked`: it will end through ended().
  void launched(c10d::OpType opType, uint64_t bytes, bool tracked);
  void ended(c10d::OpType opType, bool succeeded, std::optional<double> durationMs);

  // {kind: {"count", "bytes", "failures", "in_flight", and when timed "timed", "total_ms",
  //  "mean_ms", "p50_ms", "p99_ms"}} for every kind launched since the last reset.
  c10::impl::GenericDict snapshot() const;
  void reset();

 private:
  // Durations kept per kind for the percentiles: the latest ones, a bounded window.
  static constexpr size_t kDurationsKept = 4096;
  // One slot per c10d::OpType value (0 to 18), and the last for any other.
  static constexpr size_t kKinds = 20;
  static size_t slotOf(c10d::OpType opType);
  static c10d::OpType typeOfSlot(size_t slot);

  struct Kind {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> failures{0};
    std::atomic<int64_t> inFlight{0};
  };
  struct Durations {
    uint64_t timed = 0;
    double totalMs = 0;
    std::deque<double> latest;
  };

  std::array<Kind, kKinds> kinds_;
  mutable std::mutex durationsMutex_;
  std::array<Durations, kKinds> durations_;
};

}  // namespace streamnccl
