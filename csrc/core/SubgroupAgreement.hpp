#pragma once

// How the ranks of a group agree on a subgroup made from it (new_group, split_group,
// shrink_group), in the subgroup's own Store (keys::split or keys::shrink, StoreKeys.hpp): one
// protocol, which the core and every path use, so that a rank that gives up anywhere (the core
// before the paths split, a path while they do) ends every other rank's wait at once.
//
// Each rank counts itself in for every communicator it has live, then as arrived; once all
// have arrived, a communicator counted by all of them is live on all of them: a few Store
// requests per rank, whatever the number of ranks. Whether the subgroup goes ahead is one
// verdict, set once for all: "go" by the first to see every rank arrived, or why not by the
// first to give up (a rank arriving after that fails at once, and none starts a call the
// others will not make).

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <set>
#include <string>

namespace streamnccl::agreement {

// Which of `mine` (communicator keys) every one of `ranks` has live, as they agree through
// `store`: a communicator is shrunk or split only where all of them can take part (one broken
// on some rank was aborted there, and NCCL would wait for it forever). Raises DistBackendError
// when the verdict is not "go" (another rank gave up, or not every rank came by `timeout`).
// `rank`: this one among `ranks`; `what`: "shrink" or "split", for messages.
std::set<std::string> liveOnEveryRank(c10d::Store& store, int rank, int ranks,
                                      const std::set<std::string>& mine,
                                      std::chrono::milliseconds timeout, const std::string& what);

// Gives the verdict "not going ahead, for `reason`" unless one was given already: every rank
// taking part fails with it. Nothing without a Store.
void fail(const c10::intrusive_ptr<c10d::Store>& store, const std::string& reason);

}  // namespace streamnccl::agreement
