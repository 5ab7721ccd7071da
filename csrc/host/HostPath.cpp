#include "host/HostPath.hpp"

#include "host/HostCommunicator.hpp"
#include "host/HostDevice.hpp"

namespace streamnccl {

std::unique_ptr<Path> HostPathFactory::open(const c10::Device& device) {
  TORCH_CHECK(device.is_cpu(), "the host path serves cpu tensors, not ", device);
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<HostDevice>();
  path->communicator = std::make_shared<HostCommunicator>(gloo_);
  return path;
}

}  // namespace streamnccl
