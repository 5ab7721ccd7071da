#include "core/GroupStats.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace streamnccl {

const char* opKindName(c10d::OpType opType) {
  using c10d::OpType;
  switch (opType) {
    case OpType::BROADCAST:
      return "broadcast";
    case OpType::ALLREDUCE:
      return "all_reduce";
    case OpType::ALLREDUCE_COALESCED:
      return "allreduce_coalesced";
    case OpType::REDUCE:
      return "reduce";
    case OpType::ALLGATHER:
      return "all_gather";
    case OpType::_ALLGATHER_BASE:
      return "_all_gather_base";
    case OpType::ALLGATHER_COALESCED:
      return "ALLGATHER_coalesced";
    case OpType::GATHER:
      return "gather";
    case OpType::SCATTER:
      return "scatter";
    case OpType::REDUCE_SCATTER:
      return "reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE:
      return "_reduce_scatter_base";
    case OpType::ALLTOALL_BASE:
    case OpType::ALLTOALL:
      return "all_to_all";
    case OpType::SEND:
      return "send";
    case OpType::RECV:
    case OpType::RECVANYSOURCE:
      return "recv";
    case OpType::BARRIER:
      return "barrier";
    case OpType::COALESCED:
      return "coalesced";
    default:
      return "unknown";
  }
}

size_t GroupStats::slotOf(c10d::OpType opType) {
  // Kinds of one name share a slot.
  if (opType == c10d::OpType::ALLTOALL) {
    opType = c10d::OpType::ALLTOALL_BASE;
  } else if (opType == c10d::OpType::RECVANYSOURCE) {
    opType = c10d::OpType::RECV;
  }
  const auto value = static_cast<size_t>(opType);
  return value < kKinds - 1 ? value : kKinds - 1;
}

c10d::OpType GroupStats::typeOfSlot(size_t slot) {
  return slot < kKinds - 1 ? static_cast<c10d::OpType>(slot) : c10d::OpType::UNKNOWN;
}

void GroupStats::launched(c10d::OpType opType, uint64_t bytes, bool tracked) {
  Kind& kind = kinds_[slotOf(opType)];
  kind.count.fetch_add(1, std::memory_order_relaxed);
  kind.bytes.fetch_add(bytes, std::memory_order_relaxed);
  if (tracked) {
    kind.inFlight.fetch_add(1, std::memory_order_relaxed);
  }
}

void GroupStats::ended(c10d::OpType opType, bool succeeded, std::optional<double> durationMs) {
  const size_t slot = slotOf(opType);
  Kind& kind = kinds_[slot];
  kind.inFlight.fetch_sub(1, std::memory_order_relaxed);
  if (!succeeded) {
    kind.failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (durationMs) {
    std::lock_guard<std::mutex> lock(durationsMutex_);
    Durations& durations = durations_[slot];
    ++durations.timed;
    durations.totalMs += *durationMs;
    durations.latest.push_back(*durationMs);
    if (durations.latest.size() > kDurationsKept) {
      durations.latest.pop_front();
    }
  }
}

namespace {

// The nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::max<size_t>(rank, 1) - 1];
}

}  // namespace

c10::impl::GenericDict GroupStats::snapshot() const {
  c10::impl::GenericDict result(c10::StringType::get(), c10::AnyType::get());
  std::lock_guard<std::mutex> lock(durationsMutex_);
  for (size_t slot = 0; slot < kKinds; ++slot) {
    const Kind& kind = kinds_[slot];
    const uint64_t count = kind.count.load(std::memory_order_relaxed);
    if (count == 0) {
      continue;
    }
    c10::impl::GenericDict stats(c10::StringType::get(), c10::AnyType::get());
    stats.insert(std::string("count"), static_cast<int64_t>(count));
    stats.insert(std::string("bytes"),
                 static_cast<int64_t>(kind.bytes.load(std::memory_order_relaxed)));
    stats.insert(std::string("failures"),
                 static_cast<int64_t>(kind.failures.load(std::memory_order_relaxed)));
    stats.insert(std::string("in_flight"),
                 std::max<int64_t>(kind.inFlight.load(std::memory_order_relaxed), 0));
    const Durations& durations = durations_[slot];
    if (durations.timed > 0) {
      std::vector<double> sorted(durations.latest.begin(), durations.latest.end());
      std::sort(sorted.begin(), sorted.end());
      stats.insert(std::string("timed"), static_cast<int64_t>(durations.timed));
      stats.insert(std::string("total_ms"), durations.totalMs);
      stats.insert(std::string("mean_ms"),
                   durations.totalMs / static_cast<double>(durations.timed));
      stats.insert(std::string("p50_ms"), percentile(sorted, 50));
      stats.insert(std::string("p99_ms"), percentile(sorted, 99));
    }
    result.insert(std::string(opKindName(typeOfSlot(slot))), stats);
  }
  return result;
}

void GroupStats::reset() {
  std::lock_guard<std::mutex> lock(durationsMutex_);
  for (size_t slot = 0; slot < kKinds; ++slot) {
    kinds_[slot].count.store(0, std::memory_order_relaxed);
    kinds_[slot].bytes.store(0, std::memory_order_relaxed);
    kinds_[slot].failures.store(0, std::memory_order_relaxed);
    // Ops in flight stay counted: they are still in flight, and will end.
    durations_[slot] = Durations{};
  }
}

}  // namespace streamnccl
