#include "core/Options.hpp"

#include "core/Errors.hpp"

#include <cstdlib>
#include <cstring>

namespace streamnccl {
namespace {

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
  return resolved;
}

}  // namespace streamnccl
