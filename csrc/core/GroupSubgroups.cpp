// A group's subgroups, in one unit: split (torch's split_group, and new_group through
// splitAs()/splitWithout()) and shrink (shrink_group: the group without some of its ranks,
// typically after one of them died and broke the group). Both meet in a Store of their own
// (keys::split, keys::shrink), agree through core/SubgroupAgreement.hpp, ask each path factory
// for the subgroup's paths (PathFactory::splitSubgroup, PathFactory::shrink: NCCL makes them from
// this group's communicators), and make the new group with adoptSubgroup().

#include "core/Errors.hpp"
#include "core/ProcessGroup.hpp"
#include "core/StoreKeys.hpp"
#include "core/SubgroupAgreement.hpp"

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

// Those of `opened` on devices of `type`: what one path factory made.
std::vector<std::pair<c10::Device, Path*>> openedOfType(
    const std::vector<std::pair<c10::Device, Path*>>& opened, c10::DeviceType type) {
  std::vector<std::pair<c10::Device, Path*>> ofType;
  std::copy_if(opened.begin(), opened.end(), std::back_inserter(ofType),
               [type](const auto& entry) { return entry.first.type() == type; });
  return ofType;
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
      agreement::fail(store, why);
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
  auto group = adoptSubgroup(
      survivors, options, store, "shrink", [&](PathFactory& factory, c10::DeviceType type) {
        return factory.shrink(store, survivors, excluded, openedOfType(opened, type), abortInFlight,
                              options);
      });
  shrunk_.store(true);
  return group;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroup::splitAs(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts, const std::string& agreement) {
  std::lock_guard<std::mutex> lock(splitMutex_);
  if (lastSplit_ && lastSplit_->store == store && lastSplit_->ranks == ranks) {
    return lastSplit_->group;
  }
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  // Numbered first, so that every rank counts this split, whatever happens to it here.
  PathFactory::SplitMeeting of = meetForSplit(agreement, options_->timeout);
  // The subgroup's own settings when they are ours (pg_options of split_group), else ours.
  const auto* requested = dynamic_cast<const streamnccl::Options*>(opts.get());
  c10::intrusive_ptr<streamnccl::Options> options;
  try {
    options = streamnccl::Options::fromEnv(requested ? *requested : *options_);
  } catch (const c10::Error& refused) {
    // The other ranks wait for this one: end their wait.
    agreement::fail(of.store, who() + " split_group's options were refused: " +
                                  refused.what_without_backtrace());
    throw;
  }
  if (opts) {
    options->timeout = opts->timeout;
  }
  of.timeout = options->timeout;
  if (me == ranks.end()) {
    for (const auto& [type, factory] : factories_) {
      factory->splitWithout(ofType(of, type));
    }
    lastSplit_ = LastSplit{store, ranks, nullptr};
    return nullptr;
  }
  // torch makes a subgroup's store from its own, which a restarted torchelastic worker shares
  // with the attempt before: as python/streamnccl does for every group it creates, each
  // attempt keeps to keys of its own (a dead worker's Gloo address or NCCL unique id).
  const c10::intrusive_ptr<c10d::Store> ours = keys::storeOfThisAttempt(store);
  // The subgroup's debug checks meet through its own store.
  auto group =
      adoptSubgroup(ranks, options, ours, "split", [&](PathFactory& factory, c10::DeviceType type) {
        return factory.splitSubgroup(ours, ranks, options, ofType(of, type));
      });
  lastSplit_ = LastSplit{store, ranks, group};
  return group;
}

void ProcessGroup::splitWithout(const c10::Device& device, const std::string& agreement) {
  std::lock_guard<std::mutex> lock(splitMutex_);
  const PathFactory::SplitMeeting of = meetForSplit(agreement, options_->timeout);
  factoryFor(device, "split").splitWithout(ofType(of, device.type()));
  lastSplit_.reset();
}

PathFactory::SplitMeeting ProcessGroup::meetForSplit(const std::string& agreement,
                                                     std::chrono::milliseconds timeout) {
  PathFactory::SplitMeeting of;
  if (store_) {
    // split_group's: every rank of this group splits it in the same order (torch requires it,
    // as NCCL does), so the n-th split of each meets under the same prefix.
    of.store = splitStore(agreement.empty() ? std::to_string(splits_++) : agreement);
  }
  of.rank = getRank();
  of.size = getSize();
  of.opened = paths_.made();
  of.timeout = timeout;
  if (const std::string why = awaitOpsInFlight("split", of.opened, timeout); !why.empty()) {
    agreement::fail(of.store, why);  // the others end at once too
    throwDistBackendError(why);
  }
  return of;
}

c10::intrusive_ptr<c10d::Store> ProcessGroup::splitStore(const std::string& name) const {
  if (!store_) {
    return nullptr;
  }
  return c10::make_intrusive<c10d::PrefixStore>(keys::split(name), store_);
}

void ProcessGroup::refuseSplit(const std::string& agreement, const std::string& why) {
  agreement::fail(splitStore(agreement), who() + " " + why);
}

PathFactory::SplitMeeting ProcessGroup::ofType(const PathFactory::SplitMeeting& of,
                                               c10::DeviceType type) {
  PathFactory::SplitMeeting mine = of;
  mine.opened = openedOfType(of.opened, type);
  return mine;
}

c10::intrusive_ptr<ProcessGroup> ProcessGroup::adoptSubgroup(
    const std::vector<int>& ranks, const c10::intrusive_ptr<streamnccl::Options>& options,
    const c10::intrusive_ptr<c10d::Store>& store, const char* op, const MakePaths& makePaths) {
  PathFactories factories;
  std::vector<std::pair<c10::Device, std::unique_ptr<Path>>> paths;
  for (const auto& [type, factory] : factories_) {
    PathFactory::Subgroup part = makePaths(*factory, type);
    factories.emplace(type, std::move(part.factory));
    for (auto& entry : part.paths) {
      paths.push_back(std::move(entry));
    }
  }
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  auto group =
      ProcessGroup::make(static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                         options, std::move(factories), store);
  std::vector<int> globalRanks;
  for (const int rank : ranks) {
    globalRanks.push_back(globalRanks_.at(rank));
  }
  group->setGlobalRanks(std::move(globalRanks));
  for (auto& [device, path] : paths) {
    group->adoptPath(device, std::move(path), op);
  }
  return group;
}

}  // namespace streamnccl
