#include "host/HostPath.hpp"

#include "host/HostCommunicator.hpp"
#include "host/HostDevice.hpp"

namespace streamnccl {
namespace {

// Gloo tags of each kind of stream (see HostCommunicator). The lanes to one peer share a tag:
// one only sends to the peer, the other only receives from it.
constexpr int kGroupTag = 0;
constexpr int kLaneTag = 1;

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

PeerLanes HostPathFactory::openPeer(const c10::Device& device, int /*peer: any, over Gloo*/) {
  return {hostPath(device, gloo_, kLaneTag), hostPath(device, gloo_, kLaneTag)};
}

}  // namespace streamnccl
