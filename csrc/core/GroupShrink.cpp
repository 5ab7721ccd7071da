// ProcessGroup::shrink: the group without some of its ranks, as torch.distributed.shrink_group
// asks, typically after one of them died and broke the group.

#include "core/Errors.hpp"
#include "core/ProcessGroup.hpp"
#include "core/StoreKeys.hpp"

#include <c10/util/ScopeExit.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <set>

namespace streamnccl {
namespace {

// The excluded ranks, sorted, after torch's own checks (which a direct call skips).
std::vector<int> checkedExclusion(const std::vector<int64_t>& ranksToExclude, int rank, int size) {
  STREAMNCCL_CHECK_ARG(!ranksToExclude.empty(), "shrink", "ranks_to_exclude is empty; expected ",
                       "at least one rank to leave the group");
  std::set<int> excluded;
  for (const int64_t excludedRank : ranksToExclude) {
    STREAMNCCL_CHECK_ARG(excludedRank >= 0 && excludedRank < size, "shrink", "rank ", excludedRank,
                         " is out of range for a group of ", size);
    STREAMNCCL_CHECK_ARG(excluded.insert(static_cast<int>(excludedRank)).second, "shrink", "rank ",
                         excludedRank, " is excluded twice");
  }
  STREAMNCCL_CHECK_ARG(static_cast<int>(excluded.size()) < size, "shrink",
                       "every rank of the group is excluded; at least one must remain");
  STREAMNCCL_CHECK_ARG(!excluded.count(rank), "shrink", "this rank (", rank,
                       ") is excluded; only the remaining ranks call shrink_group");
  return {excluded.begin(), excluded.end()};
}

}  // namespace

std::string ProcessGroup::awaitOpsInFlight(const char* what,
                                           const std::vector<std::pair<c10::Device, Path*>>& opened,
                                           std::chrono::milliseconds timeout) {
  std::vector<const Communicator*> communicators;
  for (const auto& entry : opened) {
    communicators.push_back(entry.second->communicator.get());
  }
  const auto waited = timeout / 2;
  if (communicators.empty() ||
      watchdog_->finishOn(communicators, std::chrono::steady_clock::now() + waited) ||
      health_->broken()) {
    return {};
  }
  return who() + " " + what + ": its ops in flight did not end within " +
         std::to_string(waited.count()) + " ms, and NCCL " + what +
         "s a communicator only with no operation outstanding: " +
         c10::Join("; ", watchdog_->unfinished());
}

c10::intrusive_ptr<c10d::Backend> ProcessGroup::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  const std::vector<int> excluded = checkedExclusion(ranksToExclude, getRank(), getSize());
  STREAMNCCL_CHECK_ARG(shrinkFlags == 0 || shrinkFlags == kShrinkAbort, "shrink",
                       "shrink_flags is ", shrinkFlags, "; expected SHRINK_DEFAULT (0) or ",
                       "SHRINK_ABORT (1)");
  TORCH_CHECK(store_, "streamnccl: shrink needs the group's Store");
  const bool abortInFlight = shrinkFlags == kShrinkAbort;
  std::vector<int> survivors;
  for (int rank = 0; rank < getSize(); ++rank) {
    if (!std::binary_search(excluded.begin(), excluded.end(), rank)) {
      survivors.push_back(rank);
    }
  }
  // A prefix no earlier group used: the n-th shrink of this group, and whom it left out (every
  // survivor counts the same shrinks; the excluded, maybe dead, wrote nothing there).
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      keys::shrink(shrinks_++, c10::Join("-", excluded)), store_);
  const auto* requested = dynamic_cast<const streamnccl::Options*>(opts.get());
  auto options = streamnccl::Options::fromEnv(requested ? *requested : *options_);
  options->timeout = opts ? opts->timeout : options_->timeout;

  if (abortInFlight) {
    // NCCL's shrink stops the old communicators' kernels; the ops in flight fail first
    // (Watchdog.hpp's rule), and the communicators are aborted once the shrink is done with
    // them.
    watchdog_->breakGroup(
        groupInfo(),
        makeDistBackendError(who() + " shrunk with SHRINK_ABORT: its ops in "
                                     "flight were aborted"),
        {},
        Watchdog::BreakAs{GroupHealth::Cause::Fault, Watchdog::Kernels::StoppedByCaller,
                          /*shared=*/false});
    watchdog_->awaitOpsFailed();  // where another break won the race
  }
  auto abortAfterShrink = c10::make_scope_exit([&] {
    if (abortInFlight) {
      watchdog_->abortCommunicators();  // also when the shrink failed
    }
  });
  std::vector<std::pair<c10::Device, Path*>> opened = paths_.made();
  if (!abortInFlight) {
    if (const std::string why = awaitOpsInFlight("shrink", opened, options->timeout);
        !why.empty()) {
      // The other survivors, waiting in the shrink's agreement, end at once too.
      store->compareSet(keys::splitVerdict(), {}, std::vector<uint8_t>(why.begin(), why.end()));
      throwDistBackendError(why);
    }
  }
  if (abortInFlight) {
    // The others (peer-to-peer lanes) now, their ops failed: NCCL's shrink waits for the
    // streams its communicator's kernels were issued on, where a lane's stuck kernel may be
    // queued ahead of them.
    std::vector<const Communicator*> shrunkByNccl;
    for (const auto& entry : opened) {
      shrunkByNccl.push_back(entry.second->communicator.get());
    }
    watchdog_->abortCommunicatorsBut(shrunkByNccl);
  }
  PathFactories factories;
  std::vector<std::pair<c10::Device, std::unique_ptr<Path>>> paths;
  for (const auto& [type, factory] : factories_) {
    std::vector<std::pair<c10::Device, Path*>> ofType;
    std::copy_if(opened.begin(), opened.end(), std::back_inserter(ofType),
                 [type = type](const auto& entry) { return entry.first.type() == type; });
    PathFactory::Subgroup shrunk =
        factory->shrink(store, survivors, excluded, ofType, abortInFlight, options);
    factories.emplace(type, std::move(shrunk.factory));
    for (auto& entry : shrunk.paths) {
      paths.push_back(std::move(entry));
    }
  }
  const int newRank = static_cast<int>(std::find(survivors.begin(), survivors.end(), getRank()) -
                                       survivors.begin());
  auto group = ProcessGroup::make(newRank, static_cast<int>(survivors.size()), options,
                                  std::move(factories), store);
  std::vector<int> globalRanks;
  for (const int rank : survivors) {
    globalRanks.push_back(globalRanks_.at(rank));
  }
  group->setGlobalRanks(std::move(globalRanks));
  for (auto& [device, path] : paths) {
    group->adoptPath(device, std::move(path), "shrink");
  }
  shrunk_.store(true);
  return group;
}

}  // namespace streamnccl
