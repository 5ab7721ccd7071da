#pragma once

// Test-only. Where the fake NCCL communicators of one process meet: ranks that call
// ncclCommInitRank(Config) with the same unique id form one communicator once all of them
// have joined, as with NCCL. Several recorded groups (one per rank, each driven by its own
// thread) can share a world, so that init that waits on peers deadlocks here as it would on
// GPUs. A world that simulates its peers completes every communicator at its first member:
// a single recorded group then stands for its whole job.

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>

namespace streamnccl::fake {

class FakeNcclWorld {
 public:
  explicit FakeNcclWorld(bool simulatePeers) : simulatePeers_(simulatePeers) {}

  ncclUniqueId newId();
  static uint64_t keyOf(const ncclUniqueId& id);
  // `rank` of `nranks` joins the communicator `key`.
  void join(uint64_t key, int rank, int nranks);
  bool complete(uint64_t key) const;
  // Blocks until every rank has joined `key`, or `timeout` passes (false).
  bool waitComplete(uint64_t key, std::chrono::milliseconds timeout);

 private:
  struct Meeting {
    int nranks = 0;
    int joined = 0;
  };

  const bool simulatePeers_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t idsMade_ = 0;
  std::map<uint64_t, Meeting> meetings_;
};

}  // namespace streamnccl::fake
