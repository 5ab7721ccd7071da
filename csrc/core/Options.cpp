#include "core/Options.hpp"

#include "core/Errors.hpp"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace streamnccl {
namespace {

// NCCL's limits on ncclConfig_t (NCCL_MAX_CGA_CLUSTER_SIZE, MAXCHANNELS in NCCL 2.28).
constexpr int kMaxCgaClusterSize = 8;
constexpr int kMaxCtas = 64;

std::optional<bool> boolFromEnv(const char* name) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') {
    return std::nullopt;
  }
  for (const char* yes : {"1", "true", "TRUE", "True", "yes", "on"}) {
    if (std::strcmp(raw, yes) == 0) return true;
  }
  for (const char* no : {"0", "false", "FALSE", "False", "no", "off"}) {
    if (std::strcmp(raw, no) == 0) return false;
  }
  TORCH_CHECK_VALUE(false, "streamnccl: environment variable ", name, "='", raw,
                    "' is not a boolean (expected 1/0, true/false, yes/no, on/off)");
}

std::optional<std::string> stringFromEnv(const char* name) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') {
    return std::nullopt;
  }
  return std::string(raw);
}

// The non-negative integer `text` spells, or nullopt.
std::optional<int> intFromText(const std::string& text) {
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0) {
      return value;
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::optional<int> intFromEnv(const char* name) {
  const auto raw = stringFromEnv(name);
  if (!raw) {
    return std::nullopt;
  }
  const auto value = intFromText(*raw);
  TORCH_CHECK_VALUE(value, "streamnccl: environment variable ", name, "='", *raw,
                    "' is not a non-negative integer");
  return value;
}

// An NCCL_* variable as NCCL reads it (strtoll, any base), or nullopt where it is unset or
// spells no number (NCCL then keeps its default).
std::optional<long long> ncclIntFromEnv(const char* name) {
  const auto raw = stringFromEnv(name);
  if (!raw) {
    return std::nullopt;
  }
  char* end = nullptr;
  const long long value = std::strtoll(raw->c_str(), &end, 0);
  return end == raw->c_str() ? std::nullopt : std::optional<long long>(value);
}

// Refuses what streamnccl cannot honour, or NCCL would refuse, when it makes a communicator.
// (The ranges are streamnccl's: NCCL takes any cluster size of 0 or more and clamps CTAs to
// its maximum, where a value beyond it is more likely a mistake than a wish.)
void checkNcclConfig(Options::NcclConfig& config) {
  if (!config.blocking) {
    if (const auto nonblocking = boolFromEnv("TORCH_NCCL_USE_COMM_NONBLOCKING")) {
      config.blocking = !*nonblocking;
    }
  }
  TORCH_CHECK_VALUE(!config.blocking.value_or(false), "streamnccl: config.blocking is true (or ",
                    "TORCH_NCCL_USE_COMM_NONBLOCKING=0); streamnccl's NCCL communicators are ",
                    "always non-blocking, so that abort() and the group's timeout can end every ",
                    "NCCL call: leave it unset or false");
  const auto inRange = [](const char* field, const std::optional<int>& value, int low, int high) {
    TORCH_CHECK_VALUE(!value || (*value >= low && *value <= high), "streamnccl: config.", field,
                      " is ", value.value_or(0), "; expected ", low, " to ", high,
                      " (what NCCL 2.28 makes use of)");
  };
  inRange("cga_cluster_size", config.cgaClusterSize, 0, kMaxCgaClusterSize);
  inRange("min_ctas", config.minCtas, 1, kMaxCtas);
  inRange("max_ctas", config.maxCtas, 1, kMaxCtas);
  TORCH_CHECK_VALUE(!config.minCtas || !config.maxCtas || *config.minCtas <= *config.maxCtas,
                    "streamnccl: config.min_ctas (", config.minCtas.value_or(0),
                    ") is more than config.max_ctas (", config.maxCtas.value_or(0), ")");
  TORCH_CHECK_VALUE(!config.netName || !config.netName->empty(),
                    "streamnccl: config.net_name is empty; name a network NCCL has (\"IB\", ",
                    "\"Socket\") or leave it unset");
  // NCCL's own variables override the config it is given (its envConfigOverride), so two of
  // them would undo what streamnccl relies on, whatever the config says.
  TORCH_CHECK_VALUE(ncclIntFromEnv("NCCL_COMM_BLOCKING").value_or(0) != 1,
                    "streamnccl: NCCL_COMM_BLOCKING=1 makes every NCCL communicator blocking, ",
                    "and then neither abort() nor the group's timeout can end a call stuck in ",
                    "NCCL (a communicator's making, a shrink): unset it or set it to 0");
  // A subgroup split from a communicator made with splitShare shares its abort flag, both
  // ways: the subgroup's abort (its timeout, its breaking) would stop this group's kernels too,
  // and they would then fail silently, wrong data and no error. Each group is aborted alone.
  TORCH_CHECK_VALUE(!config.splitShare.value_or(false),
                    "streamnccl: config.split_share is true: a subgroup split from this group ",
                    "would share its communicator's abort flag, so a subgroup that breaks (a ",
                    "timeout, abort()) would stop this group's NCCL kernels too, silently: leave ",
                    "it unset or false");
  TORCH_CHECK_VALUE(ncclIntFromEnv("NCCL_COMM_SPLIT_SHARE_RESOURCES").value_or(0) == 0,
                    "streamnccl: NCCL_COMM_SPLIT_SHARE_RESOURCES is set: a subgroup split from a ",
                    "group would share its communicator's abort flag, so a subgroup that breaks ",
                    "would stop the group's NCCL kernels too, silently: unset it or set it to 0");
  TORCH_CHECK_VALUE(ncclIntFromEnv("NCCL_COMM_SHRINK_SHARE_RESOURCES").value_or(0) == 0,
                    "streamnccl: NCCL_COMM_SHRINK_SHARE_RESOURCES is set: a shrunk group's ",
                    "communicator would share the old one's abort flag, and the old group, ",
                    "which shrink_group ends (aborting its communicator when it is broken), ",
                    "would stop the new one too: unset it or set it to 0");
}

}  // namespace

Options::Options(std::chrono::milliseconds timeout)
    : c10d::Backend::Options(kBackendName, timeout) {}

c10::intrusive_ptr<Options> Options::fromEnv(const Options& explicitSettings) {
  auto resolved = c10::make_intrusive<Options>(explicitSettings);
  if (!resolved->highPriorityStreams) {
    resolved->highPriorityStreams = boolFromEnv("STREAMNCCL_HIGH_PRIORITY_STREAMS").value_or(false);
  }
  if (!resolved->blockingWait) {
    resolved->blockingWait = boolFromEnv("STREAMNCCL_BLOCKING_WAIT").value_or(false);
  }
  if (!resolved->debugChecks) {
    resolved->debugChecks = boolFromEnv("STREAMNCCL_DEBUG_CHECKS").value_or(false);
  }
  if (!resolved->checkInflightWrites) {
    resolved->checkInflightWrites = boolFromEnv("STREAMNCCL_CHECK_INFLIGHT_WRITES").value_or(false);
  }
  if (!resolved->propagateErrors) {
    resolved->propagateErrors = boolFromEnv("STREAMNCCL_PROPAGATE_ERRORS").value_or(true);
  }
  if (!resolved->enableTiming) {
    resolved->enableTiming = boolFromEnv("STREAMNCCL_ENABLE_TIMING").value_or(false);
  }
  if (!resolved->dumpDir) {
    resolved->dumpDir = stringFromEnv("STREAMNCCL_DUMP_DIR");
  }
  TORCH_CHECK_VALUE(!resolved->traceBufferSize || *resolved->traceBufferSize >= 0,
                    "streamnccl: trace_buffer_size is ", resolved->traceBufferSize.value_or(0),
                    ", expected a count of ops (0 or more)");
  if (!resolved->traceBufferSize) {
    resolved->traceBufferSize = intFromEnv("STREAMNCCL_TRACE_BUFFER_SIZE").value_or(2000);
  }
  if (!resolved->singleHardwareQueue) {
    resolved->singleHardwareQueue = stringFromEnv("CUDA_DEVICE_MAX_CONNECTIONS") == "1";
  }
  checkNcclConfig(resolved->ncclConfig);
  return resolved;
}

}  // namespace streamnccl
