#pragma once

// A path is how one kind of tensor travels: the device model that orders its work and the
// communicator that moves it. The core is given one PathFactory per device type at
// construction and opens a path per device on first use, so it never names a concrete
// device or communicator. Point-to-point ops outside a group travel on lanes: paths of
// their own, one per peer and direction.

#include "core/Communicator.hpp"
#include "core/Device.hpp"
#include "core/Options.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace streamnccl {

// Shared, not owned: an async op's task keeps its communicator alive, and a Work its device,
// for as long as they may still run or be waited on, even past the group's destruction.
struct Path {
  std::shared_ptr<Device> device;
  std::shared_ptr<Communicator> communicator;
  // How errors of its ops name it, when it is not the group's own: "lane 0->1", and why an
  // op on it may wait for others.
  std::string description;
};

// The two lanes between this rank and one peer on one device. Each has its own internal
// stream and communicator, so sends to the peer run in program order among themselves, and
// so do receives from it, but neither waits for the other or for the group's collectives:
// a recv posted before the send its peer waits for cannot block that send.
struct PeerLanes {
  std::unique_ptr<Path> sends;
  std::unique_ptr<Path> receives;
};

class PathFactory {
 public:
  virtual ~PathFactory() = default;
  // Opens the path for tensors on `device`. Called once per device, by every rank of the
  // group at the same op (opening may be collective). Throws c10::Error with the reason when
  // the device cannot be used.
  virtual std::unique_ptr<Path> open(const c10::Device& device) = 0;
  // Why this process has no device of this factory's type at all (no GPU, say), or nothing
  // where it has one; asks no other rank. barrier(), which moves no data of the caller's, runs
  // on the host instead, as gloo's does, since every rank of a job on such machines sees the
  // same. (A device that only some ranks lack, a wrong index, is refused at the call.)
  virtual std::optional<std::string> whyNoDevice() { return std::nullopt; }
  // Opens the lanes to `peer` (a group rank, not this one) for tensors on `device`. Called
  // once per peer and device, by both ranks at their first send or recv to each other
  // outside a group (opening may be collective between the two). The lanes' communicators
  // take group ranks. Throws c10::Error with the reason when the device cannot be used.
  virtual PeerLanes openPeer(const c10::Device& device, int peer) = 0;
  // Opens the lane of receives from any peer (recv without a source) for tensors on
  // `device`: a stream of its own, so a pending one holds up no other op. Throws c10::Error
  // with the reason where the communicator cannot receive from any source (NCCL cannot).
  virtual std::unique_ptr<Path> openAnySource(const c10::Device& device) = 0;
  // The factory for a subgroup of `ranks` (group ranks, sorted, this rank among them), whose
  // connections meet through `store`, made with the subgroup's `options` (its timeout and
  // NCCL config). Collective over the members.
  virtual std::unique_ptr<PathFactory> split(const c10::intrusive_ptr<c10d::Store>& store,
                                             const std::vector<int>& ranks,
                                             const c10::intrusive_ptr<Options>& options) = 0;

  // What a subgroup, split or shrunk from this group, starts with: the factory of its paths,
  // and the paths it made already from this group's (by device).
  struct Subgroup {
    std::unique_ptr<PathFactory> factory;
    std::vector<std::pair<c10::Device, std::unique_ptr<Path>>> paths;
  };
  // A split of this group, as every rank of it sees it, members of the subgroup or not: they
  // meet in `store` and agree there (core/SubgroupAgreement.hpp) on what goes ahead.
  struct SplitMeeting {
    // This split's own Store, which every rank of this group shares: where they agree what
    // the subgroup is made from, and where one that gives up says why.
    c10::intrusive_ptr<c10d::Store> store;
    int rank = 0;  // this rank in this group
    int size = 0;  // this group's ranks, all of which take part
    // This group's paths opened so far.
    std::vector<std::pair<c10::Device, Path*>> opened;
    std::chrono::milliseconds timeout;  // for the agreement and whatever it makes
  };
  // The subgroup of `ranks` (as in split()), whose connections meet through `store`, with the
  // subgroup's `options`. A factory may make its paths from this group's (NCCL: ncclCommSplit),
  // in which every rank of this group takes part at once: the members here, the others through
  // splitWithout(). By default a fresh split, made afresh at each path's first use.
  virtual Subgroup splitSubgroup(const c10::intrusive_ptr<c10d::Store>& store,
                                 const std::vector<int>& ranks,
                                 const c10::intrusive_ptr<Options>& options,
                                 const SplitMeeting& /*of*/) {
    return Subgroup{split(store, ranks, options), {}};
  }
  // This rank's part in a split of this group into a subgroup it is not a member of.
  virtual void splitWithout(const SplitMeeting& /*of*/) {}

  // The allocator of memory this factory's communicators register best (NCCL: ncclMemAlloc),
  // for c10d's getMemAllocator(); null where there is none, and whyNoMemAllocator() says why.
  virtual std::shared_ptr<c10::Allocator> memAllocator() { return nullptr; }
  virtual std::string whyNoMemAllocator() { return "only the NCCL path allocates memory"; }
  // Whether memAllocator() can allocate on the device of this factory's type with index
  // `index` (c10d's supportsTensorAlloc).
  virtual bool supportsTensorAlloc(c10::DeviceIndex /*index*/) { return false; }

  // The paths of this group without its ranks `excluded` (sorted), for `survivors` (the
  // others, sorted, this rank among them), whose connections meet through `store`. `opened`
  // are this group's paths opened so far; a factory may make the new group's paths from them
  // (NCCL: ncclCommShrink), ending their ops in flight first when `abortInFlight`; with the
  // new group's `options`. Collective over the survivors only: the excluded take no part, they
  // may be dead. By default, a fresh split among the survivors.
  virtual Subgroup shrink(const c10::intrusive_ptr<c10d::Store>& store,
                          const std::vector<int>& survivors, const std::vector<int>& /*excluded*/,
                          const std::vector<std::pair<c10::Device, Path*>>& /*opened*/,
                          bool /*abortInFlight*/, const c10::intrusive_ptr<Options>& options) {
    return Subgroup{split(store, survivors, options), {}};
  }
};

}  // namespace streamnccl
