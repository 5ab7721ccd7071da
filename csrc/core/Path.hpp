#pragma once

// A path is how one kind of tensor travels: the device model that orders its work and the
// communicator that moves it. The core is given one PathFactory per device type at
// construction and opens a path per device on first use, so it never names a concrete
// device or communicator.

#include "core/Communicator.hpp"
#include "core/Device.hpp"

#include <c10/core/Device.h>

#include <memory>

namespace streamnccl {

// Shared, not owned: an async op's task keeps its communicator alive, and a Work its device,
// for as long as they may still run or be waited on, even past the group's destruction.
struct Path {
  std::shared_ptr<Device> device;
  std::shared_ptr<Communicator> communicator;
};

class PathFactory {
 public:
  virtual ~PathFactory() = default;
  // Opens the path for tensors on `device`. Called once per device, by every rank of the
  // group at the same op (opening may be collective). Throws c10::Error with the reason when
  // the device cannot be used.
  virtual std::unique_ptr<Path> open(const c10::Device& device) = 0;
};

}  // namespace streamnccl
