#pragma once

#include "core/FlightRecorder.hpp"
#include "core/GroupHealth.hpp"
#include "core/GroupRegistry.hpp"
#include "core/GroupStats.hpp"
#include "core/InflightWrites.hpp"
#include "core/Kernels.hpp"
#include "core/Launcher.hpp"
#include "core/OnceMap.hpp"
#include "core/Options.hpp"
#include "core/Path.hpp"
#include "core/TensorList.hpp"
#include "core/TorchVersion.hpp"
#include "core/Watchdog.hpp"
#include "core/Work.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace streamnccl {

// The c10d::Backend registered as "streamnccl". It validates every call, lowers it to
// buffer-level Communicator calls (Collectives.cpp, PointToPoint.cpp) and launches them
// through the launch path (Launcher.hpp), which follows the stream contract written in
// Device.hpp. It knows neither CUDA, NCCL nor Gloo: the paths for each device type come from
// the PathFactory given at construction.
class ProcessGroup final : public c10d::Backend {
 public:
  using PathFactories = std::unordered_map<c10::DeviceType, std::unique_ptr<PathFactory>>;

  // Only make() has the key: every group is known to the process's registry.
  class Key {
    Key() {}  // provided, not defaulted: no `Key{}` elsewhere as an aggregate
    friend class ProcessGroup;
  };
  // A group, known to the process's registry (GroupRegistry.hpp), which shuts it down at exit
  // if it is still alive then. `store`: where the debug checks meet (Options::debugChecks);
  // may be null without them.
  static c10::intrusive_ptr<ProcessGroup> make(int rank, int size,
                                               c10::intrusive_ptr<streamnccl::Options> options,
                                               PathFactories factories,
                                               c10::intrusive_ptr<c10d::Store> store = nullptr) {
    auto group = c10::make_intrusive<ProcessGroup>(Key(), rank, size, std::move(options),
                                                   std::move(factories), std::move(store));
    groupRegistry::add(group, group->uid_, group->watchdog_);
    return group;
  }
  ProcessGroup(Key key, int rank, int size, c10::intrusive_ptr<streamnccl::Options> options,
               PathFactories factories, c10::intrusive_ptr<c10d::Store> store);
  // The last reference went: the group is shut down (see letGo()). The registry's weak
  // reference keeps the object itself until then.
  void release_resources() override { letGo(); }
  ~ProcessGroup() override { letGo(); }  // a group the registry never knew

  const std::string getBackendName() const override { return kBackendName; }
  // A copy: torch writes a subgroup's name and timeout into the options it asks for here.
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    return c10::make_intrusive<streamnccl::Options>(*options_);
  }
  const c10::intrusive_ptr<streamnccl::Options>& options() const { return options_; }
  uint64_t getSequenceNumberForGroup() override { return launcher_.launched(); }
  void setTimeout(std::chrono::milliseconds timeout) override { options_->timeout = timeout; }
  bool supportsCoalescing() const override { return true; }
  // SUCCESS until the group breaks; then TIMEOUT or COMM_ERROR where it broke, REMOTE_ERROR
  // where the break was learned from another rank (BreakBoard.hpp). Told once the break has
  // failed the ops it took out of flight: whoever sees the error finds them failed (the
  // break's own callbacks, on its thread, are told at once).
  c10d::ErrorType getError() override;
  // torch's _register_on_completion_hook (CompletionHooks.hpp); ops are timed from now on,
  // for the hook's active duration.
  void registerOnCompletionHook(
      std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
  // Returns once every op issued so far has ended and the completion hooks have been told of
  // them, or the group broke; raises after the group's timeout (torch calls it before
  // destroying a group with hooks).
  void waitForPendingWorks() override;
  // torch's _enable_collectives_timing: ops are timed from now on, as with enable_timing.
  void enableCollectivesTiming() override { launcher_.setTimed(); }
  bool supportsSplitting() const override { return true; }
  // A new group of `ranks` (this group's ranks) with paths of its own, or null when this
  // rank is not among them. Collective over every rank of this group, in the same order on
  // each (as torch's split_group asks): where this group's NCCL communicator is live on every
  // rank, the subgroup's is split from it (ncclCommSplit), and the ranks outside the subgroup
  // take part in that; else the subgroup connects afresh at its first op.
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override {
    return splitAs(store, ranks, opts, "");
  }
  // split() where the ranks of this group meet under the name `agreement`, which they all
  // know (new_group's name), instead of under this group's count of splits (split_group's
  // ranks name their subgroups apart, and all of them split in the same order).
  c10::intrusive_ptr<c10d::Backend> splitAs(const c10::intrusive_ptr<c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<c10d::Backend::Options>& opts,
                                            const std::string& agreement);
  // A rank's part in a split of this group into a subgroup it is not in, when torch makes
  // that subgroup with new_group (torch's perform_nocolor_split on the ranks outside it, while
  // the creator of the subgroup calls splitAs() on those in it), meeting as `agreement`.
  void splitWithout(const c10::Device& device, const std::string& agreement);
  // Ends the split meeting as `agreement` at once, failed for `why`, on every rank (one that
  // cannot take part, such as a member whose subgroup's options are refused).
  void refuseSplit(const std::string& agreement, const std::string& why);
  bool supportsShrinking() const override { return true; }
  // The group without `ranksToExclude` (this group's ranks), its survivors renumbered in
  // order, with connections of its own (GroupSubgroups.cpp). Collective over the survivors only;
  // the excluded take no part (they may be dead), and the group may be broken. Its ops in
  // flight go on (its destruction, which shrink_group does next, finishes them), or with
  // kShrinkAbort fail at once, breaking it. `opts`: the new group's settings (else this
  // group's).
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  static constexpr int kShrinkAbort = 0x01;  // torch's SHRINK_ABORT, NCCL's NCCL_SHRINK_ABORT
  // Breaks the group at once: in-flight ops fail, communicators are aborted, and every later
  // call raises. Returns without waiting for anything.
  void abort() override;
  // Ends the group, as destroy_process_group() does (and the group's destruction, and Python's
  // exit for groups still alive then): the ops in flight are finished first, up to the group's
  // timeout, then the communicators are closed in order (NCCL: finalized, then destroyed).
  // Only a broken group, or ops still unfinished at the timeout, aborts them instead, and says
  // so in the log. Later calls raise. Idempotent; returns once the group's threads are done,
  // except on one of them (an op's future callback): the teardown then goes on on a thread of
  // its own, which the process's exit waits for (GroupTeardown.hpp).
  void shutdown() override;
  // shutdown() of every group alive in this process (at exit, before the interpreter
  // finalizes: a thread that releases tensors needs the GIL, which it then no longer gives).
  static void shutdownAll();
  // Every live group counts its ops whose end has passed as ended, so that a dump of the
  // flight recorder does not show a waited-for op as still running.
  static void retireCompletedOfAll();
  // Sequence numbers start at 0 in every group; there is nothing to agree on.
  void setSequenceNumberForGroup() override {}
  // Opens the path for `device` now (on CUDA: creates the NCCL communicator) instead of at
  // the first op. Collective: every rank calls it.
  void eagerConnectSingleDevice(at::Device device) override;

  // GroupMemory.cpp: memory NCCL registers best (ncclMemAlloc), and its registration with the
  // group's communicator of a device, as ProcessGroupNCCL has them.
  std::shared_ptr<c10::Allocator> getMemAllocator() override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override;
  // Registers each (address, bytes) with the communicator of `device` (opened already: not
  // collective), all or none; register_mem_pool's segments. With `skipRegistered` (a pool's,
  // registered again once it grew), those registered already are left as they are; else they
  // are refused.
  void registerMemory(const c10::Device& device,
                      const std::vector<std::pair<void*, size_t>>& segments,
                      bool skipRegistered = false);
  // Ends those registrations, once the ops issued on the communicator so far have run (NCCL
  // would unmap the memory under their kernels); captured ops are not waited for. Nothing to
  // do once the group is broken or shut down: NCCL released them with the communicator. With
  // `skipUnknown` (a pool's segments, some grown since its registration), addresses not
  // registered are passed over; else they are refused.
  void deregisterMemory(const c10::Device& device, const std::vector<void*>& addresses,
                        bool skipUnknown = false);

  // Makes `path` this group's path for `device`, as if opened at a first op (a split or shrunk
  // group's paths made from its parent's by `op`).
  void adoptPath(const c10::Device& device, std::unique_ptr<Path> path, const char* op);

  // The global rank of each member (torch's global_ranks_in_group; by default the group's own
  // ranks), which the flight recorder's dump and the profiler's metadata name.
  void setGlobalRanks(std::vector<int> globalRanks);
  // This group's stats per op kind (GroupStats::snapshot), and their reset.
  // Ops whose end has passed are counted first, so that a waited-for op is not in flight.
  c10::impl::GenericDict statsSnapshot() const {
    watchdog_->releaseCompleted();
    return stats_->snapshot();
  }
  // (An op still in flight at the reset is counted when it ends, as ended after it.)
  void resetStats() {
    watchdog_->releaseCompleted();
    stats_->reset();
  }

  // Collectives.cpp
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& outputTensor, at::Tensor& inputTensor,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputTensorLists,
      std::vector<at::Tensor>& inputTensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputTensors, std::vector<std::vector<at::Tensor>>& inputTensors,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& outputTensor, at::Tensor& inputTensor,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;

  // PointToPoint.cpp
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  // recv without a source (host path only): the Work's sourceRank() names the sender.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
#if STREAMNCCL_TORCH_AT_LEAST(2, 14)
  // torch 2.14+'s gather into one tensor (dist.gather_into_tensor; 2.15: dist.gather_single;
  // c10d's gather_into_tensor forwards here): the root's `output` holds the ranks' inputs in
  // rank order.
  c10::intrusive_ptr<c10d::Work> gather_single(
      at::Tensor& output, at::Tensor& input,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
#endif
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputTensors, std::vector<std::vector<at::Tensor>>& inputTensors,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& outputTensor, at::Tensor& inputTensor, std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputTensors, std::vector<at::Tensor>& inputTensors,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;

  // Barriers.cpp
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  // torch.distributed.monitored_barrier (MonitoredBarrier.hpp), through the group's Store.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;

  // GroupCoalescing.cpp
  // Between these, ops are recorded instead of launched; endCoalescing() launches them as one
  // communicator group on the internal stream and returns its one Work.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  // The ops recorded since startCoalescing().
  struct Coalesced {
    Path* path = nullptr;
    std::vector<Steps> steps;
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> outputs;
    // Handed out by every op of the group as it is recorded; the group's launch completes it.
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };

  Path& pathFor(const c10::Device& device, const char* op);
  enum class Direction { Send, Receive };
  // The lane a send to, or a recv from, `peer` outside a group runs on (see PeerLanes).
  Path& laneFor(const c10::Device& device, int peer, Direction direction, const char* op);
  // The lane every recv from any source on `device` runs on.
  Path& anySourceLaneFor(const c10::Device& device, const char* op);
  PathFactory& factoryFor(const c10::Device& device, const char* op) const;
  // Raises the cause at once if the group is broken or shut down (atomic reads otherwise).
  void refuseIfBroken(const char* op) const;
  // shutdown()'s work, run once (see shutdown()).
  void close();
  // The teardown once the last reference went (release_resources(), or the destructor of a
  // group never registered), then the group leaves the registry: after it, so that the exit,
  // which waits for the groups dying meanwhile, also waits for a teardown this hands off.
  void letGo();
  // Runs a factory's opening of a path for `op`: a reason the device cannot be used becomes a
  // bad argument, a fault while connecting breaks the group. Each communicator opened is
  // watched (and aborted with the group) from the moment it exists.
  template <typename Open>
  auto openOrRefuse(const char* op, const c10::Device& device, Open open) -> decltype(open());
  // "[streamnccl rank r/n pg=name]", as errors name this group.
  std::string who() const;
  // Records the ops `record` submits into one coalesced group (the open one, or a new one
  // ended here), so they run as one communicator group with one Work. A bad argument in any
  // of them raises before anything of a new group is launched.
  c10::intrusive_ptr<c10d::Work> coalesce(const std::function<void()>& record);
  // Launches the op now, or records it while coalescing.
  c10::intrusive_ptr<c10d::Work> submit(Launch launch, Path& path, Steps steps);
  // Launches the op through the launch path (Launcher.hpp), unless the group is broken or shut
  // down. `future`: see Work's constructor.
  c10::intrusive_ptr<Work> launch(Launch launch, Path& path, Steps steps,
                                  c10::intrusive_ptr<c10::ivalue::Future> future = {});
  // The launch hooks of this group's features (hooks/Hooks.hpp), in their order.
  LaunchHooks launchHooks();
  // gather() and gather_single(): `input` of every rank into `ranksParts` (rank order) on the
  // root; the Work reports `outputs`.
  c10::intrusive_ptr<c10d::Work> gatherToRoot(const char* op, const at::Tensor& input,
                                              std::vector<at::Tensor>& inputs,
                                              std::vector<at::Tensor> ranksParts,
                                              std::vector<at::Tensor> outputs,
                                              const c10d::GatherOptions& opts);
  // This group as OpInfo describes it, for messages and the flight recorder's dump.
  OpInfo groupInfo() const;
  // The device barrier() runs on: the one it names (or the group's), or the host where no
  // rank has a device of that type at all (PathFactory::whyNoDevice), as gloo's barrier runs
  // whatever ids it is given. A barrier carries no data, so where it runs changes nothing but
  // its cost.
  c10::Device barrierDevice(const c10d::BarrierOptions& opts);
  // Where barriers naming a device of `named`'s type run, agreed once per group and type
  // through the Store at the first such barrier (every rank calls barrier() in the same
  // order), within `timeout`: on the device where every rank has one, on the host where none
  // has (said once in the log), and nowhere where only some have (refused, naming them, on
  // every rank) or the agreement failed (a rank did not come, or a group broke).
  struct BarrierPlace {
    enum class Kind { kDevice, kHost, kRefused, kFailed };
    Kind kind = Kind::kDevice;
    std::string why;  // kRefused's and kFailed's
  };
  const BarrierPlace& barrierPlaceFor(const c10::Device& named, std::chrono::milliseconds timeout);
  // The next split of this group, as its factories see it (PathFactory::SplitMeeting), meeting as
  // `agreement` (when empty, as the n-th split), its subgroup's paths made within `timeout`.
  // With splitMutex_ held.
  PathFactory::SplitMeeting meetForSplit(const std::string& agreement,
                                         std::chrono::milliseconds timeout);
  // NCCL's split, and its shrink without NCCL_SHRINK_ABORT, need the communicator's operations
  // finished (NCCL 2.30's docs: "no outstanding NCCL operations on the comm", else a deadlock
  // may follow): waits until the ops in flight on the communicators of `opened` (not the
  // lanes', nor the host path's) have ended, or the group broke (its communicators are then
  // not split but made afresh), for half of `timeout` (the other members' agreement waits the
  // whole of it, so they learn of a failure here before they give up). Returns why not, for
  // `what`'s error; empty once they have. Captured ops (CUDA graphs) are not waited for.
  std::string awaitOpsInFlight(const char* what,
                               const std::vector<std::pair<c10::Device, Path*>>& opened,
                               std::chrono::milliseconds timeout);
  // The one end of split and shrink: the subgroup of this group's `ranks` (sorted, this rank
  // among them), made from what `makePaths` asks of each path factory (its factory, and the
  // paths it made already), with `options`, meeting through `store`; told its global ranks,
  // and given those paths, which it waits for (`op` names the call in errors).
  using MakePaths = std::function<PathFactory::Subgroup(PathFactory&, c10::DeviceType)>;
  c10::intrusive_ptr<ProcessGroup> adoptSubgroup(
      const std::vector<int>& ranks, const c10::intrusive_ptr<streamnccl::Options>& options,
      const c10::intrusive_ptr<c10d::Store>& store, const char* op, const MakePaths& makePaths);
  // Where the ranks of this group meet for the split `name` (null without a Store).
  c10::intrusive_ptr<c10d::Store> splitStore(const std::string& name) const;
  // `of` with only the opened paths of devices of `type`.
  static PathFactory::SplitMeeting ofType(const PathFactory::SplitMeeting& of,
                                          c10::DeviceType type);
  // The path of `device` opened already, for registering memory with its communicator.
  Path& openedPathFor(const c10::Device& device, const char* op);

  struct LaneKeyHash {
    size_t operator()(const std::pair<c10::Device, int>& key) const {
      return std::hash<c10::Device>()(key.first) * 31 + std::hash<int>()(key.second);
    }
  };

  const c10::intrusive_ptr<streamnccl::Options> options_;
  const PathFactories factories_;
  const c10::intrusive_ptr<c10d::Store> store_;

  const std::shared_ptr<GroupHealth> health_;
  const std::shared_ptr<GroupStats> stats_;
  const std::shared_ptr<Watchdog> watchdog_;
  const int64_t uid_;  // this process's count of groups

  std::vector<int> globalRanks_;
  Launcher launcher_;  // after what its hooks read: the above

  // Opened on first use; a slow opening holds up only the ops that need that path.
  OnceMap<c10::Device, Path> paths_;
  OnceMap<std::pair<c10::Device, int>, PeerLanes, LaneKeyHash> lanes_;
  OnceMap<c10::Device, Path> anySourceLanes_;
  mutable std::mutex lastDeviceMutex_;
  std::optional<c10::Device> lastAcceleratorDevice_;
  std::mutex barrierPlacesMutex_;
  std::map<c10::DeviceType, BarrierPlace> barrierPlaces_;

  // The group's teardown: Open -> Closing (the first shutdown(), which closes it: later ops
  // raise) -> Closed (close() has returned: the other shutdown() calls, waiting for it, return;
  // except on a group thread, see shutdown()). Breaking is GroupHealth's, and independent: a
  // broken group is still closed, and a closed one may break while it closes.
  enum class Life : uint8_t { Open, Closing, Closed };
  static constexpr std::pair<Life, Life> kLifeMoves[] = {
      {Life::Open, Life::Closing},
      {Life::Closing, Life::Closed},
  };
  std::atomic<Life> life_{Life::Open};  // moved with closedMutex_ held; read by ops without it
  bool closed() const { return life_.load(std::memory_order_acquire) != Life::Open; }
  void moveLife(Life to);  // with closedMutex_ held: a move of kLifeMoves (asserted)
  std::mutex closedMutex_;
  std::condition_variable closedChanged_;
  bool letGo_ = false;          // letGo() ran: the last reference went, on one thread
  bool apartReserved_ = false;  // letGo() counted a teardown apart ahead (see there)
  // Coalescing is per calling thread's program order, like every op of a group.
  std::optional<Coalesced> coalescing_;

  // torch asks a backend serving several device types to split once per type: the second
  // ask, for the same store and ranks, gets the first one's group (or, outside it, null).
  struct LastSplit {
    c10::intrusive_ptr<c10d::Store> store;  // held: a new one at the same address is not it
    std::vector<int> ranks;
    c10::intrusive_ptr<c10d::Backend> group;
  };
  std::mutex splitMutex_;
  std::optional<LastSplit> lastSplit_;
  int splits_ = 0;  // split_group's splits of this group so far
  // Shrinks of this group so far: each new group meets under a store prefix of its own.
  int shrinks_ = 0;
  // Monitored barriers of this group so far: each meets under a store prefix of its own.
  std::atomic<int> monitoredBarriers_{0};
  // Once shrunk, its communicators are aborted at close rather than finalized: finalizing
  // waits for every member, and the ranks left out take no part.
  std::atomic<bool> shrunk_{false};
};

}  // namespace streamnccl
