#pragma once

#include "core/Path.hpp"
#include "host/LazyGloo.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace streamnccl {

// Opens the host path for CPU tensors: one worker-thread device and a Gloo communicator, and
// per peer lane another worker and communicator over the same Gloo backend, which the first
// of them makes (LazyGloo).
class HostPathFactory final : public PathFactory {
 public:
  explicit HostPathFactory(std::shared_ptr<LazyGloo> gloo) : gloo_(std::move(gloo)) {}
  std::unique_ptr<Path> open(const c10::Device& device) override;
  PeerLanes openPeer(const c10::Device& device, int peer) override;
  std::unique_ptr<Path> openAnySource(const c10::Device& device) override;
  std::unique_ptr<PathFactory> split(const c10::intrusive_ptr<c10d::Store>& store,
                                     const std::vector<int>& ranks,
                                     const c10::intrusive_ptr<Options>& options) override;

 private:
  const std::shared_ptr<LazyGloo> gloo_;
};

}  // namespace streamnccl
