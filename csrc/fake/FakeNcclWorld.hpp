#pragma once

// Test-only. Where the fake GPUs of one job meet, and what runs them. Ranks that call
// ncclCommInitRank(Config) with the same unique id form one communicator once all of them
// have joined, as with NCCL. Several recorded groups (one per rank, each driven by its own
// thread) can share a world, so that init that waits on peers deadlocks here as it would on
// GPUs. A world that simulates its peers completes every communicator at its first member:
// a single recorded group then stands for its whole job, its peers mirrors of it.
//
// The world's engine runs the GPUs' streams: on a thread of its own (FakeModels::progress), so
// that work completes whether or not anyone looks, or else when a query asks. An NCCL kernel
// runs together with its peers' matching kernels (FakeModels::peers): a collective when every
// member's is first on its stream, a send with the matching recv; then the data moves
// (FakeCollectives). Everything on every GPU of the world happens under the world's one lock.

#include "fake/FakeModels.hpp"
#include "fake/FakeStreamItem.hpp"

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

namespace streamnccl::fake {

class FakeGpu;

class FakeNcclWorld {
 public:
  FakeNcclWorld(bool simulatePeers, FakeModels models);
  ~FakeNcclWorld();
  FakeNcclWorld(const FakeNcclWorld&) = delete;
  FakeNcclWorld& operator=(const FakeNcclWorld&) = delete;

  const FakeModels& models() const { return models_; }
  bool simulatesPeers() const { return simulatePeers_; }
  std::recursive_mutex& mutex() { return mutex_; }

  // --- GPUs and communicators
  void addGpu(FakeGpu* gpu);
  void removeGpu(FakeGpu* gpu);
  ncclUniqueId newId();
  static uint64_t keyOf(const ncclUniqueId& id);
  // The key of the `nth` communicator shrunk from `parent` without `excluded`: the same for
  // every survivor, and never a unique id's.
  static uint64_t shrunkKey(uint64_t parent, int nth, const std::vector<int>& excluded);
  // ncclCommSplit: member `rank` of communicator `parent` (of `nranks` members) takes part in
  // its `nth` split, with `color` (NCCL_SPLIT_NOCOLOR: it joins no new one) and `key`. A split
  // is collective over all of `parent`'s members: where each lands is known once all have
  // taken part (in a world that simulates its peers, at once: they mirror this one, so its
  // new communicator has all of `parent`'s members).
  void joinSplit(uint64_t parent, int nth, int rank, int nranks, int color, int key);
  // Where member `rank` lands in `parent`'s `nth` split: the new communicator's key, and its
  // rank and size there (ranked by key, then by rank in `parent`); nranks 0 for a member that
  // passed NCCL_SPLIT_NOCOLOR. Nothing until every member has taken part.
  struct SplitPlace {
    uint64_t key = 0;
    int rank = 0;
    int nranks = 0;
  };
  std::optional<SplitPlace> splitPlace(uint64_t parent, int nth, int rank) const;
  // `rank` of `nranks` joins the communicator `key`, on `gpu`.
  void join(uint64_t key, int rank, int nranks, FakeGpu* gpu);
  bool complete(uint64_t key) const;
  // Blocks until every rank has joined `key`, or `timeout` passes (false).
  bool waitComplete(uint64_t key, std::chrono::milliseconds timeout);
  // Numbers `launch`'s operations in its member's order on the communicator (NcclOp::index).
  void number(NcclLaunch& launch);
  // A CUDA graph that captured member `rank`'s work on communicator `key` was made (+1) or
  // destroyed (-1): NCCL finalizes, destroys or aborts the communicator only once none is left.
  void holdForGraph(uint64_t key, int rank, int change);
  int graphsHolding(uint64_t key, int rank) const;
  // ncclCommFinalize of member `rank`: a node's members finalize together, so each one's
  // completes once all of them have called it.
  void finalizing(uint64_t key, int rank);
  bool allFinalizing(uint64_t key) const;
  // ncclCommDestroy freed member `rank`'s communicator `key`: a kernel of it running from now
  // on is a use after free (checkNotDestroyed).
  void markDestroyed(uint64_t key, int rank);
  void checkNotDestroyed(FakeGpu& gpu, StreamId stream, const Item& item);

  // --- the engine
  // Something may now run: wakes the engine's thread.
  void notify();
  // Runs whatever can run now, on every GPU of the world.
  void advance();
  // Waits (running the engine itself when it has no thread) until `done()` holds or
  // `timeout` passes; false then. Called with the lock held by `lock`.
  template <typename Done>
  bool waitUntil(std::unique_lock<std::recursive_mutex>& lock, std::chrono::milliseconds timeout,
                 Done done);

 private:
  struct Member {
    FakeGpu* gpu = nullptr;
    StreamId stream = 0;
    const Item* item = nullptr;
  };
  // One ncclCommSplit of a communicator: per member, its color and key.
  struct SplitMeeting {
    int nranks = 0;
    std::map<int, std::pair<int, int>> chosen;
  };
  struct Meeting {
    int nranks = 0;
    int joined = 0;
    std::map<int, FakeGpu*> gpus;
    std::map<int, uint64_t> collectives;  // per rank, collectives numbered
    // Per (from, to): the messages sent, and those received, numbered apart.
    std::map<std::pair<int, int>, uint64_t> sends;
    std::map<std::pair<int, int>, uint64_t> recvs;
    std::set<int> destroyed;
    std::set<int> finalizing;
    std::map<int, int> graphs;  // per member, the live graphs holding it
  };

  void loop();
  // Runs the NCCL kernel first on `stream` of `gpu` with the kernels of its peers it needs,
  // if they are all first on their streams; true if it ran.
  bool runWithPeers(FakeGpu& gpu, StreamId stream, const Item& item);
  // The kernels that must run together with `item` (runWithPeers), or nullopt while one of
  // them is not yet first on its stream.
  std::optional<std::vector<Member>> runningWith(FakeGpu& gpu, StreamId stream, const Item& item);
  // The kernel of member `rank` of `comm` first on one of its GPU's streams that holds the
  // operation `match` accepts, or none.
  template <typename Match>
  std::optional<Member> findHead(uint64_t comm, int rank, Match match);

  const bool simulatePeers_;
  const FakeModels models_;
  mutable std::recursive_mutex mutex_;
  std::condition_variable_any changed_;
  std::set<FakeGpu*> gpus_;
  uint64_t idsMade_ = 0;
  std::map<uint64_t, Meeting> meetings_;
  std::map<std::pair<uint64_t, int>, SplitMeeting> splits_;  // by parent and which split
  bool stopping_ = false;
  std::thread engine_;
};

template <typename Done>
bool FakeNcclWorld::waitUntil(std::unique_lock<std::recursive_mutex>& lock,
                              std::chrono::milliseconds timeout, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (!models_.progress) {
      advance();
    }
    if (done()) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    changed_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

}  // namespace streamnccl::fake
