// ProcessGroup's memory for NCCL: the allocator of memory its communicators register best
// (getMemAllocator, allocateTensor; NCCL's ncclMemAlloc), and the registration of memory with
// the communicator of a device (register_mem_pool's segments; ncclCommRegister). The core
// knows neither: the path factory of the device's type provides the allocator, and the
// communicator registers.

#include "core/Errors.hpp"
#include "core/ProcessGroup.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/StringUtil.h>

namespace streamnccl {

std::shared_ptr<c10::Allocator> ProcessGroup::getMemAllocator() {
  std::vector<std::string> why;
  for (const auto& [type, factory] : factories_) {
    if (auto allocator = factory->memAllocator()) {
      return allocator;
    }
    why.push_back(c10::DeviceTypeName(type, /*lower_case=*/true) + ": " +
                  factory->whyNoMemAllocator());
  }
  TORCH_CHECK(false, who(),
              " getMemAllocator: no path of this group allocates memory NCCL registers (",
              c10::Join("; ", why), ")");
}

bool ProcessGroup::supportsTensorAlloc(c10::DeviceIndex deviceIdx) {
  for (const auto& [type, factory] : factories_) {
    if (factory->supportsTensorAlloc(deviceIdx)) {
      return true;
    }
  }
  return false;
}

at::Tensor ProcessGroup::allocateTensor(long size, at::TensorOptions options) {
  constexpr const char* op = "allocate_tensor";
  STREAMNCCL_CHECK_ARG(options.has_device(), op, "the options name no device; expected one of ",
                       "the group's cuda devices");
  STREAMNCCL_CHECK_ARG(size >= 0, op, "size is ", size, "; expected at least 0");
  c10::Device device = options.device();
  if (!device.has_index() && !device.is_cpu()) {
    // As ProcessGroupNCCL: the group's bound device stands for "cuda".
    const auto bound = getBoundDeviceId();
    STREAMNCCL_CHECK_ARG(bound && bound->type() == device.type(), op, "the device ", device,
                         " has no index, and the group is bound to none of that type; ",
                         "expected a device with its index");
    device = *bound;
    options = options.device(device);
  }
  refuseIfBroken(op);
  PathFactory& factory = factoryFor(device, op);
  auto allocator = factory.memAllocator();
  STREAMNCCL_CHECK_ARG(allocator != nullptr, op, "tensors on ", device,
                       " are not allocated by this group: ", factory.whyNoMemAllocator());
  STREAMNCCL_CHECK_ARG(factory.supportsTensorAlloc(device.index()), op, "cannot allocate on ",
                       device, ": the device is not usable here");
  // The allocator allocates on the current device (ncclMemAlloc does).
  c10::DeviceGuard onDevice(device);
  const size_t bytes = static_cast<size_t>(size) * options.dtype().itemsize();
  // Not resizable: the storage never asks the allocator again, so it need not outlive it
  // (each allocation's deleter keeps what freeing it needs).
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, allocator.get(),
                       /*resizable=*/false);
  return at::empty({0}, options).set_(std::move(storage), 0, {size}, {1});
}

Path& ProcessGroup::openedPathFor(const c10::Device& requested, const char* op) {
  const c10::Device device = requested.is_cpu() ? c10::Device(c10::kCPU) : requested;
  factoryFor(device, op);  // refuses a device type this build has no path for
  for (const auto& [opened, path] : paths_.made()) {
    if (opened == device) {
      return *path;
    }
  }
  // Opening it here would be collective, and a rank that registers alone would wait for the
  // others until the timeout; ProcessGroupNCCL refuses too.
  STREAMNCCL_CHECK_ARG(false, op, "the group has no communicator on ", device,
                       " yet; connect it first, on every rank (init_process_group(device_id=...)",
                       ", eager_connect_single_device, or any op on a tensor there)");
}

void ProcessGroup::registerMemory(const c10::Device& device,
                                  const std::vector<std::pair<void*, size_t>>& segments,
                                  bool skipRegistered) {
  constexpr const char* op = "register_mem_pool";
  refuseIfBroken(op);
  Communicator& communicator = *openedPathFor(device, op).communicator;
  std::vector<void*> registered;
  try {
    for (const auto& [address, bytes] : segments) {
      if (skipRegistered && communicator.isRegistered(address)) {
        continue;
      }
      communicator.registerMemory(address, bytes, who());
      registered.push_back(address);
    }
  } catch (...) {
    // All or none: a pool registered in part could not be deregistered as a pool.
    for (void* address : registered) {
      try {
        communicator.deregisterMemory(address, who());
      } catch (...) {  // the first error is the one that matters
      }
    }
    throw;
  }
}

void ProcessGroup::deregisterMemory(const c10::Device& device, const std::vector<void*>& addresses,
                                    bool skipUnknown) {
  constexpr const char* op = "deregister_mem_pool";
  if (health_->broken() || closed()) {
    return;  // the communicators were aborted or destroyed, and their registrations with them
  }
  Path& path = openedPathFor(device, op);
  // NCCL unmaps registered memory at once, under any kernel still queued that uses it: the
  // ops issued on this communicator so far end first, sync ones (on whatever stream) included,
  // since the watchdog watches every op.
  const auto deadline = std::chrono::steady_clock::now() + options_->timeout;
  if (!watchdog_->finishOn({path.communicator.get()}, deadline) && !health_->broken()) {
    throwDistBackendError(who() + " " + op + ": its ops in flight did not end within " +
                          std::to_string(options_->timeout.count()) +
                          " ms, and deregistering memory under their kernels would unmap it: " +
                          c10::Join("; ", watchdog_->unfinished()));
  }
  if (health_->broken()) {
    return;  // broke meanwhile: the registrations went with the communicators
  }
  for (void* address : addresses) {
    if (skipUnknown && !path.communicator->isRegistered(address)) {
      continue;
    }
    path.communicator->deregisterMemory(address, who());
  }
}

}  // namespace streamnccl
