#pragma once

// What a group knows of its own failures: the flight recorder of its latest ops, and the
// first fault that broke it. Shared by the group, its watchdog and its ops' tasks, which may
// outlive the group by a moment.

#include "core/FlightRecorder.hpp"

#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

namespace streamnccl {

class GroupHealth {
 public:
  GroupHealth(size_t recorderCapacity, std::optional<std::string> dumpDir);

  FlightRecorder& recorder() { return recorder_; }

  // Marks the group broken by `error` unless it already is, then logs the flight recorder's
  // summary and writes it as JSON to the dump directory. `group` names the group and rank.
  // True when this call broke the group.
  bool breakWith(const OpInfo& group, std::exception_ptr error);
  // Cheap enough for every launch; raiseIfBroken() then says why.
  bool broken() const { return brokenFlag_.load(std::memory_order_acquire); }
  // Raises DistBackendError naming `op` and the original cause if the group is broken.
  void raiseIfBroken(const OpInfo& group, const char* op) const;

 private:
  FlightRecorder recorder_;
  const std::optional<std::string> dumpDir_;
  mutable std::mutex mutex_;
  std::exception_ptr broken_;
  std::atomic<bool> brokenFlag_{false};
  std::string cause_;
};

}  // namespace streamnccl
