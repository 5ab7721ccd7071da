#pragma once

// Test-only. The semantics the fake GPU models, each of which a test can switch off to show
// that the tests of it fail without it (tests/test_fake_models.py).

#include <string>

namespace streamnccl::fake {

struct FakeModels {
  // Memory lifetime: blocks are tracked, freed ones poisoned and handed out again at once, and
  // every buffer a kernel uses is checked when it runs (FakeMemory).
  bool memory = true;
  // Each thread's current device, checked against every call's stream, event or communicator.
  bool devices = true;
  // Stream capture: captured events, the capture's mode, waits that would cross the capture's
  // boundary, the graph's private memory pool and replays.
  bool capture = true;
  // The NCCL path's own ATen kernels (copies, divisions, products) are stream items, run in
  // stream order (off: they run when issued, as on a CPU).
  bool atenKernels = true;
  // An NCCL kernel runs when every member's matching kernel can, and moves the data; a send
  // when its peer's recv runs (off: each runs alone when its stream gets there, moving nothing).
  bool peers = true;
  // ncclCommFinalize and ncclCommDestroy wait for the communicator's kernels (off: at once).
  bool teardown = true;
  // The streams run on the GPU's own thread and queries only look (off: a query runs the
  // streams up to what it asks about, and nothing runs otherwise).
  bool progress = true;
  // A non-blocking communicator's call or group end may return ncclInProgress when a test
  // asks for it (off: the request is ignored and the call completes at once).
  bool inProgress = true;
  // CUDA calls fail when a test asks for it, once or for good (off: the request is ignored).
  bool cudaErrors = true;
  // ncclCommShrink: the survivors meet in a communicator of their own, renumbered in order,
  // ready once every one of them has shrunk, and NCCL_SHRINK_ABORT first stops the parent's
  // kernels (off: the new communicator keeps the parent's members and is ready at once, and
  // the parent's kernels go on).
  bool shrink = true;
  // ncclCommSplit: collective over every member of the parent (NCCL_SPLIT_NOCOLOR ones
  // included), each new communicator of the members of one color, ranked by key, and, as a
  // shrink, made on NCCL's thread while the parent stays busy, `*newcomm` written only once it
  // is ready (off: the new communicator keeps the parent's members, made at once).
  bool split = true;
  // NCCL's memory registration (FakeNcclMemory): ncclMemFree of registered memory, and
  // ncclCommDeregister under a queued kernel using the memory, twice, or on another
  // communicator, are violations (off: none is checked, and deregistration always succeeds).
  bool registration = true;
  // CUDA_DEVICE_MAX_CONNECTIONS=1: all streams of a GPU share one hardware queue, in issue
  // order, and work that cannot run holds up everything behind it. Off by default, as on GPUs.
  bool singleQueue = false;

  // Sets the model called `name` (the field's name in snake_case); false if there is none.
  bool set(const std::string& name, bool on) {
    bool* field = name == "memory"         ? &memory
                  : name == "devices"      ? &devices
                  : name == "capture"      ? &capture
                  : name == "aten_kernels" ? &atenKernels
                  : name == "peers"        ? &peers
                  : name == "teardown"     ? &teardown
                  : name == "progress"     ? &progress
                  : name == "in_progress"  ? &inProgress
                  : name == "cuda_errors"  ? &cudaErrors
                  : name == "single_queue" ? &singleQueue
                  : name == "shrink"       ? &shrink
                  : name == "split"        ? &split
                  : name == "registration" ? &registration
                                           : nullptr;
    if (field != nullptr) {
      *field = on;
    }
    return field != nullptr;
  }
};

}  // namespace streamnccl::fake
