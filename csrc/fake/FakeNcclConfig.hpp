#pragma once

// Test-only. How the fake NCCL reads an ncclConfig_t and the NCCL_* variables that override
// it, as NCCL's parseCommConfig and envConfigOverride do; and the names its log gives.

#include "fake/RecordingCuda.hpp"

#include <nccl.h>

#include <chrono>
#include <string>

namespace streamnccl::fake {

// How long a blocking init, shrink or split waits for the other members before the fake says
// it would wait forever.
constexpr auto kBlockingInitWait = std::chrono::seconds(60);

inline std::string commName(ncclComm_t comm) { return "C" + std::to_string(number(comm)); }

// An NCCL_* variable as NCCL reads it, or NCCL_CONFIG_UNDEF_INT where unset or no number.
int ncclEnvInt(const char* name);
// Whether a communicator made with `config` blocks: NCCL_COMM_BLOCKING (0 or 1) overrides the
// config, whose unset field means blocking (NCCL's envConfigOverride, then its default).
bool blocksWith(const ncclConfig_t* config);
// Whether splits of a communicator made with `config` share its resources, its abort flag
// among them: NCCL_COMM_SPLIT_SHARE_RESOURCES overrides the config's splitShare (default: no).
// As for shrinks, NCCL reads it from the parent's config.
bool splitsShareWith(const ncclConfig_t* config);
// Whether shrinks of a communicator made with `config` share its resources, its abort flag
// among them: NCCL_COMM_SHRINK_SHARE_RESOURCES overrides the config's shrinkShare (default:
// no). NCCL reads it from the parent's config; the shrink's own config says nothing of it.
bool shrinksShareWith(const ncclConfig_t* config);
// The fields of `config` its caller set, as the log shows them ("" when none): what NCCL reads.
std::string configText(const ncclConfig_t* config);
// Why NCCL refuses `config` with ncclInvalidArgument (its parseCommConfig), or "".
std::string configRefusal(const ncclConfig_t* config);

}  // namespace streamnccl::fake
