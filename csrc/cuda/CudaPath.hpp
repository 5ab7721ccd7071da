#pragma once

#include "core/Options.hpp"
#include "core/Path.hpp"
#include "cuda/CudaApi.hpp"
#include "cuda/NcclApi.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace streamnccl {

class NcclCommunicator;

// Opens the NCCL path for one CUDA device: a CudaDevice and that device's NCCL communicator
// over the whole group. A peer's lanes are each a CudaDevice (so a stream of their own) and a
// two-rank communicator carrying one direction: a communicator is not safe to use from two
// streams at once, and one per direction is what lets a recv and a send between the same
// two ranks progress independently.
class CudaPathFactory final : public PathFactory {
 public:
  // `nccl` and `cuda`: NcclApi::library() and CudaApi::runtime(), or the recording fakes.
  CudaPathFactory(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda,
                  c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                  c10::intrusive_ptr<Options> options);
  std::unique_ptr<Path> open(const c10::Device& device) override;
  // What CudaApi::checkUsable refuses the first device for.
  std::optional<std::string> whyNoDevice() override;
  PeerLanes openPeer(const c10::Device& device, int peer) override;
  // Refused: NCCL has no receive from any source.
  std::unique_ptr<Path> openAnySource(const c10::Device& device) override;
  // A fresh factory over the subgroup's store and with its options: its communicators are
  // made from scratch.
  std::unique_ptr<PathFactory> split(const c10::intrusive_ptr<c10d::Store>& store,
                                     const std::vector<int>& ranks,
                                     const c10::intrusive_ptr<Options>& options) override;
  // The subgroup's factory, and its communicators split from this group's (ncclCommSplit)
  // where every rank of this group still has that communicator live (agreed through
  // `of.store`); the others are made afresh when first used.
  Subgroup splitSubgroup(const c10::intrusive_ptr<c10d::Store>& store,
                         const std::vector<int>& ranks, const c10::intrusive_ptr<Options>& options,
                         const SplitMeeting& of) override;
  // Takes part, with NCCL_SPLIT_NOCOLOR, in the splits that splitSubgroup() makes on the members.
  void splitWithout(const SplitMeeting& of) override;
  // The survivors' factory, and their communicators shrunk from this group's (ncclCommShrink,
  // NCCL 2.27+) where every survivor still has that communicator live; the others are made
  // afresh when first used. Refused at the call with an older NCCL, where there is one to
  // shrink.
  Subgroup shrink(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& survivors,
                  const std::vector<int>& excluded,
                  const std::vector<std::pair<c10::Device, Path*>>& opened, bool abortInFlight,
                  const c10::intrusive_ptr<Options>& options) override;
  // NcclMemory.cpp: memory from ncclMemAlloc (made once, on first use), where this process
  // has a GPU and the NCCL loaded has ncclMemAlloc.
  std::shared_ptr<c10::Allocator> memAllocator() override;
  std::string whyNoMemAllocator() override;
  bool supportsTensorAlloc(c10::DeviceIndex index) override;

 private:
  const std::shared_ptr<NcclApi> nccl_;
  const std::shared_ptr<CudaApi> cuda_;
  const c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int size_;
  const c10::intrusive_ptr<Options> options_;
  // Ranks open their devices in the same op order, so the n-th communicator of each rank
  // shares the n-th unique id, whatever device index each rank uses.
  std::mutex mutex_;  // paths of different devices and peers open concurrently
  int communicatorsOpened_ = 0;
  // Likewise per peer: the n-th lanes two ranks open to each other meet under the same keys.
  std::unordered_map<int, int> lanesOpened_;
  std::once_flag allocatorMade_;
  // The one way split and shrink make a subgroup's paths from this group's `opened`: those
  // whose communicator every one of `ranks` taking part has live (agreed through `store`,
  // core/SubgroupAgreement.hpp; `rank`: this one among them), in key order (the same on every
  // rank), each on a device of its own, with the communicator `child` makes from this group's.
  using MakeChild = std::function<std::shared_ptr<NcclCommunicator>(const NcclCommunicator& parent,
                                                                    const c10::Device& device)>;
  std::vector<std::pair<c10::Device, std::unique_ptr<Path>>> childPaths(
      const std::vector<std::pair<c10::Device, Path*>>& opened, c10d::Store& store, int rank,
      int ranks, std::chrono::milliseconds timeout, const Options& options, const char* what,
      const MakeChild& child);
  std::shared_ptr<c10::Allocator> allocator_;
};

}  // namespace streamnccl
