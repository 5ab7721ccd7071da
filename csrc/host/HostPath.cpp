#include "host/HostPath.hpp"

#include "host/HostCommunicator.hpp"
#include "host/HostDevice.hpp"

namespace streamnccl {
namespace {

// Gloo tags of each kind of stream (see HostCommunicator). The lanes to one peer share a tag:
// one only sends to the peer, the other only receives from it.
constexpr int kGroupTag = 0;
constexpr int kLaneTag = 1;

std::unique_ptr<Path> hostPath(const c10::Device& device, const std::shared_ptr<LazyGloo>& gloo,
                               int tag) {
  TORCH_CHECK(device.is_cpu(), "the host path serves cpu tensors, not ", device);
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<HostDevice>();
  path->communicator = std::make_shared<HostCommunicator>(gloo->get(), tag, gloo);
  return path;
}

}  // namespace

std::unique_ptr<Path> HostPathFactory::open(const c10::Device& device) {
  return hostPath(device, gloo_, kGroupTag);
}

PeerLanes HostPathFactory::openPeer(const c10::Device& device, int peer) {
  PeerLanes lanes{hostPath(device, gloo_, kLaneTag), hostPath(device, gloo_, kLaneTag)};
  const int rank = gloo_->get()->getRank();
  lanes.sends->description = "lane " + std::to_string(rank) + "->" + std::to_string(peer);
  lanes.receives->description = "lane " + std::to_string(peer) + "->" + std::to_string(rank);
  return lanes;
}

std::unique_ptr<Path> HostPathFactory::openAnySource(const c10::Device& device) {
  // The lanes' tag: peers send to this rank on their lanes, whichever recv takes the message.
  return hostPath(device, gloo_, kLaneTag);
}

std::unique_ptr<PathFactory> HostPathFactory::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const std::vector<int>& ranks,
                                                    const c10::intrusive_ptr<Options>& options) {
  return std::make_unique<HostPathFactory>(gloo_->split(store, ranks, options->timeout));
}

}  // namespace streamnccl
