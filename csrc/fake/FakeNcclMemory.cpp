#include "fake/FakeNcclMemory.hpp"

#include "fake/FakeMemory.hpp"

#include <sstream>

namespace streamnccl::fake {
namespace {

std::string hex(uintptr_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

}  // namespace

ncclResult_t FakeNcclMemory::memAlloc(void** ptr, size_t size) {
  gpu_.log().add("ncclMemAlloc(" + std::to_string(size) + ")");
  // From the fake's allocator, so that a kernel using it after ncclMemFree is caught there.
  c10::DataPtr memory = FakeMemory::instance().allocate(size);
  *ptr = memory.get();
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_.emplace(reinterpret_cast<uintptr_t>(*ptr), std::move(memory));
  return ncclSuccess;
}

ncclResult_t FakeNcclMemory::memFree(void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  const std::string call = "ncclMemFree(" + hex(address) + ")";
  gpu_.log().add(call);
  c10::DataPtr freed;  // freed once the lock is let go: FakeMemory calls back into the GPU
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = allocations_.find(address);
  if (found == allocations_.end()) {
    gpu_.log().violation(call + ": ncclMemAlloc did not hand it out, or it was freed already");
    return ncclInvalidArgument;
  }
  const size_t size = FakeMemory::instance().lookup(ptr).size;
  if (gpu_.models().registration) {
    for (const auto& [handle, registration] : handles_) {
      if (registration.begin < address + size && address < registration.begin + registration.size) {
        gpu_.log().violation(call + " while it is still registered with " + registration.comm.name +
                             " (handle " + hex(handle) +
                             "): NCCL keeps its mappings of freed memory, which the next "
                             "allocation there reuses (ncclCommDeregister first)");
      }
    }
  }
  freed = std::move(found->second);
  allocations_.erase(found);
  return ncclSuccess;
}

ncclResult_t FakeNcclMemory::commRegister(const Comm& comm, void* buff, size_t size,
                                          void** handle) {
  const auto begin = reinterpret_cast<uintptr_t>(buff);
  gpu_.log().add("ncclCommRegister(" + comm.name + ", " + std::to_string(size) + ")");
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [made, registration] : handles_) {
    if (registration.comm.number == comm.number && registration.begin <= begin &&
        begin + size <= registration.begin + registration.size) {
      ++registration.refs;  // as NCCL: the covering registration's handle, counted
      *handle = reinterpret_cast<void*>(made);
      return ncclSuccess;
    }
  }
  // Never dereferenced: handles only name registrations, as NCCL's are opaque to callers.
  const uintptr_t made = (++handlesMade_ << 4) | 0x8;
  handles_.emplace(made, Registration{comm, begin, size, 1});
  *handle = reinterpret_cast<void*>(made);
  return ncclSuccess;
}

ncclResult_t FakeNcclMemory::commDeregister(const Comm& comm, void* handle) {
  const auto value = reinterpret_cast<uintptr_t>(handle);
  const std::string call = "ncclCommDeregister(" + comm.name + ", " + hex(value) + ")";
  gpu_.log().add(call);
  if (handle == nullptr) {
    return ncclSuccess;  // NCCL made no registration (NCCL_LOCAL_REGISTER=0)
  }
  if (!gpu_.models().registration) {
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = handles_.find(value);
  if (found == handles_.end()) {
    gpu_.log().violation(call + ": " + describe(handle) + " (NCCL: ncclInvalidUsage)");
    return ncclInvalidUsage;
  }
  Registration& registration = found->second;
  if (registration.comm.number != comm.number) {
    gpu_.log().violation(call + ": the handle was made on " + registration.comm.name +
                         ", not this communicator (NCCL: ncclInvalidUsage)");
    return ncclInvalidUsage;
  }
  if (--registration.refs > 0) {
    return ncclSuccess;
  }
  if (gpu_.launchUses(comm.key, comm.rank, registration.begin,
                      registration.begin + registration.size)) {
    gpu_.log().violation(call + " while a kernel of " + comm.name +
                         " that uses the memory is still queued: NCCL unmaps it from the "
                         "peers at once, under the kernel (wait for the ops first)");
  }
  retired_[value] = "deregistered already, as often as it was registered";
  handles_.erase(found);
  return ncclSuccess;
}

void FakeNcclMemory::released(int64_t comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = handles_.begin(); it != handles_.end();) {
    if (it->second.comm.number == comm) {
      retired_[it->first] = "released with " + it->second.comm.name + " when it was freed";
      it = handles_.erase(it);
    } else {
      ++it;
    }
  }
}

std::string FakeNcclMemory::describe(const void* handle) const {
  auto retired = retired_.find(reinterpret_cast<uintptr_t>(handle));
  return retired == retired_.end() ? "no ncclCommRegister made this handle"
                                   : "the handle was " + retired->second;
}

}  // namespace streamnccl::fake
