#pragma once

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

  // STREAMNCCL_HIGH_PRIORITY_STREAMS: create the internal CUDA streams with high priority.
  std::optional<bool> highPriorityStreams;
  // STREAMNCCL_BLOCKING_WAIT: work.wait() also blocks the host until the op completes (and
  // raises once the op's timeout passes), instead of only joining the caller's stream.
  std::optional<bool> blockingWait;

  // A copy of `explicitSettings` with every unset setting resolved. The only function in the
  // project that reads the environment.
  static c10::intrusive_ptr<Options> fromEnv(const Options& explicitSettings);

  bool useHighPriorityStreams() const { return highPriorityStreams.value_or(false); }
  bool useBlockingWait() const { return blockingWait.value_or(false); }
};

}  // namespace streamnccl
