#pragma once

// torch.distributed.monitored_barrier: a barrier that names the ranks that did not reach it,
// as gloo's does (torch 2.14+ sends it to any group with a CPU backend; older releases refuse it
// in Python for every backend but gloo). It meets through the group's Store, not through a
// communicator: it must report a rank that is stuck, which a collective would wait for, and it
// takes nothing from the ops in flight.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>

namespace streamnccl {

// Rank 0 waits for every other rank to arrive within `timeout` and then lets them go; one that
// has not arrived fails rank 0's call naming it ("Rank 2 failed to pass monitoredBarrier in
// 2000 ms"), or, with `waitAllRanks`, every such rank ("Ranks 1, 2 failed ..."), and fails the
// others' calls at once, saying so; a rank whose group broke is named at once, with its reason.
// The other ranks arrive and wait to be let go, as long as rank 0 may take to decide and as
// long again. Every rank of the group calls it in the same
// order; `store` is this barrier's own (a prefix no other barrier uses). `stop` throws where
// this rank must not wait on (its group broke): it is asked before and while waiting, so that
// no rank waits out the timeout on a group that cannot meet. Messages are gloo's, which tools
// and tests look for; `who` prefixes them as every streamnccl error.
void monitoredBarrier(c10d::Store& store, int rank, int size, std::chrono::milliseconds timeout,
                      bool waitAllRanks, const std::string& who, const std::function<void()>& stop);

}  // namespace streamnccl
