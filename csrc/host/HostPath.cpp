#include "host/HostPath.hpp"

#include "host/HostCommunicator.hpp"
#include "host/HostDevice.hpp"

#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace streamnccl {
namespace {

// Gloo tags of each kind of stream (see HostCommunicator). The lanes to one peer share a tag:
// one only sends to the peer, the other only receives from it.
constexpr int kGroupTag = 0;
constexpr int kLaneTag = 1;
// Where a subgroup's Gloo meets, under the subgroup's store (as python/streamnccl does).
constexpr const char* kGlooStorePrefix = "streamnccl/gloo/";

std::unique_ptr<Path> hostPath(const c10::Device& device,
                               const c10::intrusive_ptr<c10d::Backend>& gloo, int tag) {
  TORCH_CHECK(device.is_cpu(), "the host path serves cpu tensors, not ", device);
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<HostDevice>();
  path->communicator = std::make_shared<HostCommunicator>(gloo, tag);
  return path;
}

}  // namespace

std::unique_ptr<Path> HostPathFactory::open(const c10::Device& device) {
  return hostPath(device, gloo_, kGroupTag);
}

PeerLanes HostPathFactory::openPeer(const c10::Device& device, int peer) {
  const int rank = gloo_->getRank();
  PeerLanes lanes{hostPath(device, gloo_, kLaneTag), hostPath(device, gloo_, kLaneTag)};
  lanes.sends->description = "lane " + std::to_string(rank) + "->" + std::to_string(peer);
  lanes.receives->description = "lane " + std::to_string(peer) + "->" + std::to_string(rank);
  return lanes;
}

std::unique_ptr<Path> HostPathFactory::openAnySource(const c10::Device& device) {
  // The lanes' tag: peers send to this rank on their lanes, whichever recv takes the message.
  return hostPath(device, gloo_, kLaneTag);
}

std::unique_ptr<PathFactory> HostPathFactory::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const std::vector<int>& ranks) {
  // Gloo splits itself; its keys stay apart from ours, as at the group's creation.
  auto glooStore = c10::make_intrusive<c10d::PrefixStore>(kGlooStorePrefix, store);
  auto subgroup = gloo_->split(glooStore, ranks, gloo_->getBackendOptions());
  TORCH_CHECK(subgroup, "streamnccl: Gloo did not split for ranks ", c10::Join(", ", ranks));
  return std::make_unique<HostPathFactory>(std::move(subgroup));
}

}  // namespace streamnccl
