#pragma once

// The launch hooks streamnccl registers on a group (Launch.hpp's LaunchHook), one file each.
// ProcessGroup's constructor registers them in this order; a hook whose feature is off is not
// registered at all.

#include "core/CompletionHooks.hpp"
#include "core/GroupHealth.hpp"
#include "core/GroupStats.hpp"
#include "core/InflightWrites.hpp"
#include "core/Launch.hpp"
#include "core/Options.hpp"
#include "core/Watchdog.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <memory>
#include <vector>

namespace streamnccl::hooks {

// The group as hooks may read it: rank, size and c10d's names, which torch sets after the
// group is made, and its members' global ranks (ProcessGroup::setGlobalRanks). Both outlive
// the hooks.
struct GroupView {
  const c10d::Backend& group;
  const std::vector<int>& globalRanks;
};

// torch.profiler's record_param_comms range around every launch (ProfilerRange.cpp).
std::unique_ptr<LaunchHook> profilerRange(GroupView view);
// The flight recorder's sequence numbers and entry for every op (RecorderEntries.cpp).
std::unique_ptr<LaunchHook> recorderEntries(GroupView view, int64_t uid);
// The debug same-op check (STREAMNCCL_DEBUG_CHECKS): every rank's collective matched through
// the Store before it is issued; a mismatch breaks the group (SameOpCheck.cpp).
std::unique_ptr<LaunchHook> sameOpCheck(GroupView view, c10::intrusive_ptr<c10d::Store> store,
                                        std::shared_ptr<Watchdog> watchdog);
// Hooks from outside the product: a maker added here is asked by every group made after, and
// may make none. The seam through which streamnccl._testing adds its fault injection
// (csrc/testing/TestFault.cpp), so that no test double ships in streamnccl._C.
using HookMaker = std::function<std::unique_ptr<LaunchHook>(GroupView view)>;
void addHookMaker(HookMaker maker);
// The makers added so far, in the order they were added (HookMakers.cpp).
std::vector<HookMaker> hookMakers();
// The check of writes to an async op's tensors before wait() (InflightWritesWatch.cpp).
std::unique_ptr<LaunchHook> inflightWritesWatch(std::shared_ptr<InflightWrites> writes);
// streamnccl.stats(): ops and bytes launched (StatsCount.cpp).
std::unique_ptr<LaunchHook> statsCount(std::shared_ptr<GroupStats> stats);
// Completion hooks' issue times (IssueTimes.cpp), while any hook is registered.
std::unique_ptr<LaunchHook> issueTimes(std::shared_ptr<Watchdog> watchdog);

}  // namespace streamnccl::hooks
