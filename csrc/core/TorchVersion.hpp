#pragma once

// The torch release being compiled against, for the few places where c10d's interface differs
// between the releases streamnccl supports (2.11 to 2.15; see docs/torch-releases.md).

#include <torch/version.h>

#define STREAMNCCL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||             \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
