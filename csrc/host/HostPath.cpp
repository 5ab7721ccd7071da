#include "host/HostPath.hpp"

#include "host/HostCommunicator.hpp"
#include "host/HostDevice.hpp"

namespace streamnccl {
namespace {

// Gloo tags of each kind of stream (see HostCommunicator). The lanes to one peer share a tag:
// one only sends to the peer, the other only receives from it.
constexpr int kGroupTag = 0;
constexpr int kLaneTag = 1;

// `peer`: the rank the path's ops exchange with (nullopt: every member); `waits`: whether its
// ops wait for their calls wherever they run (a recv from any source learns its source so).
std::unique_ptr<Path> hostPath(const c10::Device& device, const std::shared_ptr<LazyGloo>& gloo,
                               int tag, std::optional<int> peer, bool waits = false) {
  TORCH_CHECK(device.is_cpu(), "the host path serves cpu tensors, not ", device);
  auto path = std::make_unique<Path>();
  // An op posts at once, on any thread, when its peers are known to have opened Gloo; else
  // its task waits for them on the stream's worker.
  std::weak_ptr<LazyGloo> opened = gloo;
  auto host = std::make_shared<HostDevice>([opened, peer, waits] {
    auto lazy = opened.lock();
    return !waits && lazy && lazy->knownOpen(peer);
  });
  path->communicator =
      std::make_shared<HostCommunicator>(gloo->get(), tag, host->hostStream(), gloo);
  path->device = std::move(host);
  return path;
}

}  // namespace

std::unique_ptr<Path> HostPathFactory::open(const c10::Device& device) {
  return hostPath(device, gloo_, kGroupTag, std::nullopt);
}

PeerLanes HostPathFactory::openPeer(const c10::Device& device, int peer) {
  PeerLanes lanes{hostPath(device, gloo_, kLaneTag, peer), hostPath(device, gloo_, kLaneTag, peer)};
  const int rank = gloo_->get()->getRank();
  lanes.sends->description = "lane " + std::to_string(rank) + "->" + std::to_string(peer);
  lanes.receives->description = "lane " + std::to_string(peer) + "->" + std::to_string(rank);
  return lanes;
}

std::unique_ptr<Path> HostPathFactory::openAnySource(const c10::Device& device) {
  // The lanes' tag: peers send to this rank on their lanes, whichever recv takes the message.
  return hostPath(device, gloo_, kLaneTag, std::nullopt, /*waits=*/true);
}

std::unique_ptr<PathFactory> HostPathFactory::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const std::vector<int>& ranks,
                                                    const c10::intrusive_ptr<Options>& options) {
  return std::make_unique<HostPathFactory>(gloo_->split(store, ranks, options->timeout));
}

}  // namespace streamnccl
