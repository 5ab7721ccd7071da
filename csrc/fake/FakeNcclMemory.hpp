#pragma once

// Test-only. NCCL's own memory as RecordingNccl models it (FakeModels::registration): what
// ncclMemAlloc hands out, and the registrations of memory with communicators
// (ncclCommRegister). NCCL maps registered memory for the communicator's peers and keeps those
// mappings until ncclCommDeregister, which does not wait for the communicator's kernels. So:
//   - ncclMemFree of memory still registered with a live communicator is a violation (NCCL
//     would keep mappings of freed memory, which the next allocation there reuses);
//   - ncclCommDeregister while a kernel of the communicator that uses the memory is still
//     queued is a violation (its memory is unmapped under it);
//   - a handle deregistered more often than it was registered, never made, or deregistered on
//     another communicator than its own is a violation, and NCCL's ncclInvalidUsage.
// Registering memory covered by a registration of the same communicator hands out its handle
// again, counted, as NCCL does. ncclCommAbort and ncclCommDestroy release a communicator's
// registrations. The memory itself comes from FakeMemory, so the memory model checks its uses
// by kernels once it is freed.

#include "fake/FakeGpu.hpp"

#include <c10/core/Allocator.h>
#include <nccl.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace streamnccl::fake {

class FakeNcclMemory {
 public:
  explicit FakeNcclMemory(FakeGpu& gpu) : gpu_(gpu) {}

  ncclResult_t memAlloc(void** ptr, size_t size);
  ncclResult_t memFree(void* ptr);
  // The communicator: its number in RecordingNccl, name, and key and rank in the world (whose
  // kernels on this GPU deregistration checks).
  struct Comm {
    int64_t number = 0;
    std::string name;
    uint64_t key = 0;
    int rank = 0;
  };
  ncclResult_t commRegister(const Comm& comm, void* buff, size_t size, void** handle);
  ncclResult_t commDeregister(const Comm& comm, void* handle);
  // The communicator was aborted or destroyed: NCCL released its registrations.
  void released(int64_t comm);

 private:
  struct Registration {
    Comm comm;
    uintptr_t begin = 0;
    size_t size = 0;
    int refs = 0;
  };
  std::string describe(const void* handle) const;

  FakeGpu& gpu_;
  std::mutex mutex_;
  std::map<uintptr_t, c10::DataPtr> allocations_;  // ncclMemAlloc's, by address
  std::map<uintptr_t, Registration> handles_;      // live registrations, by handle
  std::map<uintptr_t, std::string> retired_;       // handles no longer live, and why
  uintptr_t handlesMade_ = 0;
};

}  // namespace streamnccl::fake
