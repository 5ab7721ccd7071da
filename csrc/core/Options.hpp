#pragma once

#include "core/TorchVersion.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <optional>
#include <string>

namespace streamnccl {

inline constexpr const char* kBackendName = "streamnccl";

// Every setting of a streamnccl process group. A setting left unset (nullopt) is taken from
// its STREAMNCCL_* environment variable by fromEnv(), else from its default; a value set
// explicitly (from Python: streamnccl.Options(...)) always wins.
class Options : public c10d::Backend::Options {
 public:
  explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout);
#if STREAMNCCL_TORCH_AT_LEAST(2, 14)
  // torch 2.14+ copies a group's options through this before handing them to a child group
  // (ProcessGroup::splitGroup); c10d's own would copy only its base part.
  c10::intrusive_ptr<c10d::Backend::Options> clone() const override {
    return c10::make_intrusive<Options>(*this);
  }
#endif

  // STREAMNCCL_HIGH_PRIORITY_STREAMS: create the internal CUDA streams with high priority.
  std::optional<bool> highPriorityStreams;
  // STREAMNCCL_BLOCKING_WAIT: work.wait() also blocks the host until the op completes (and
  // raises once the op's timeout passes), instead of only joining the caller's stream.
  std::optional<bool> blockingWait;

  // STREAMNCCL_DUMP_DIR: where a group that breaks (a timeout or a communication failure)
  // writes this process's flight recorder, as <dir>/streamnccl_trace_rank_<global rank> in
  // torch's format (torchfrtrace reads the folder); unset, the summary goes to the log only.
  std::optional<std::string> dumpDir;
  // STREAMNCCL_TRACE_BUFFER_SIZE: how many of the latest ops the flight recorder keeps (the
  // recorder is one per process: it keeps the most any group asks for); 0 records nothing.
  std::optional<int> traceBufferSize;
  // STREAMNCCL_ENABLE_TIMING: every op is timed between a start and an end event (on CUDA,
  // events with timing, which cost more to record): work.get_duration(), the flight recorder
  // and the group's stats then have durations.
  std::optional<bool> enableTiming;
  // STREAMNCCL_DEBUG_CHECKS: before each collective, every rank checks through the Store that
  // all ranks issue the same op with compatible shapes, and raises naming both sides if not.
  // Slow (a Store round trip per op); for finding mismatched collectives.
  std::optional<bool> debugChecks;
  // STREAMNCCL_CHECK_INFLIGHT_WRITES: every async op records the version counters of its
  // tensors at launch, and a tensor written meanwhile by anything but streamnccl's own ops
  // raises at wait() (or, never waited for, is logged once per group). See InflightWrites.hpp.
  std::optional<bool> checkInflightWrites;
  // STREAMNCCL_PROPAGATE_ERRORS (on by default): a group that breaks on one rank posts the
  // break to the group's Store, and every other rank breaks its group with it within about a
  // second, whatever its timeout; getError() says REMOTE_ERROR there. See BreakBoard.hpp.
  std::optional<bool> propagateErrors;

  // CUDA_DEVICE_MAX_CONNECTIONS=1 (CUDA's own variable, read here as well): all streams of a
  // device share one hardware queue, so kernels run in issue order across streams. The two
  // lanes to a peer then issue their first, held-back ops in program order, and a lane op's
  // timeout says why a send and a recv posted apart could not both progress.
  std::optional<bool> singleHardwareQueue;

  // How NCCL makes the group's communicators: the fields of ncclConfig_t that
  // ProcessGroupNCCL.Options().config exposes. Unset, a field is NCCL's own default. NCCL's
  // own variables (NCCL_CGA_CLUSTER_SIZE, NCCL_MIN_CTAS, NCCL_MAX_CTAS, NCCL_NET) override a
  // field even where it is set. Checked by fromEnv(), which refuses what NCCL would, and the
  // three NCCL variables that would undo streamnccl's own settings (NCCL_COMM_BLOCKING=1,
  // NCCL_COMM_SPLIT_SHARE_RESOURCES, NCCL_COMM_SHRINK_SHARE_RESOURCES).
  struct NcclConfig {
    // TORCH_NCCL_USE_COMM_NONBLOCKING (inverted). Only false: streamnccl's communicators are
    // non-blocking, so that abort() and the group's timeout can end every NCCL call.
    std::optional<bool> blocking;
    std::optional<int> cgaClusterSize;  // 0 to 8
    std::optional<int> minCtas;         // 1 to 64 (alone: up to NCCL's maximum, 64)
    std::optional<int> maxCtas;         // 1 to 64, at least minCtas
    std::optional<std::string> netName;
    std::optional<bool> splitShare;  // only false: a split would share its abort flag (refused)
  };
  NcclConfig ncclConfig;

  // A copy of `explicitSettings` with every unset setting resolved. Every STREAMNCCL_*
  // variable of the product is read here (the test doubles' STREAMNCCL_TEST_FAULT is theirs);
  // the one other variable streamnccl reads is torchelastic's TORCHELASTIC_RESTART_COUNT
  // (keys::storeOfThisAttempt, StoreKeys.hpp).
  static c10::intrusive_ptr<Options> fromEnv(const Options& explicitSettings);

  bool useHighPriorityStreams() const { return highPriorityStreams.value_or(false); }
  bool useBlockingWait() const { return blockingWait.value_or(false); }
  bool useDebugChecks() const { return debugChecks.value_or(false); }
  bool useTiming() const { return enableTiming.value_or(false); }
  bool useInflightWriteChecks() const { return checkInflightWrites.value_or(false); }
  bool usePropagateErrors() const { return propagateErrors.value_or(true); }
  bool hasSingleHardwareQueue() const { return singleHardwareQueue.value_or(false); }
  size_t flightRecorderCapacity() const { return static_cast<size_t>(traceBufferSize.value_or(0)); }
};

}  // namespace streamnccl
