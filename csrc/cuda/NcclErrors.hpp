#pragma once

#include "core/Errors.hpp"
#include "cuda/NcclApi.hpp"

#include <string>

namespace streamnccl {

// `who` says where it failed: "[streamnccl rank r/n cuda:d]".
[[noreturn]] inline void throwNcclError(NcclApi& nccl, ncclResult_t result, const char* call,
                                        const std::string& who, ncclComm_t comm, const char* file,
                                        int line) {
  const char* detail = nccl.getLastError(comm);
  throwDistBackendError(who + " " + call + " failed: " + nccl.getErrorString(result) +
                        (detail && *detail ? std::string(" (") + detail + ")" : "") + " at " +
                        file + ":" + std::to_string(line));
}

// Calls `nccl.call` and raises DistBackendError naming `function` unless it succeeded. For
// calls on a communicator, which may return ncclInProgress, see NcclConnection::Use::check.
#define STREAMNCCL_NCCL_CHECK(nccl, function, call, who, comm)                              \
  do {                                                                                      \
    const ncclResult_t streamnccl_result_ = (nccl).call;                                    \
    if (streamnccl_result_ != ncclSuccess) {                                                \
      ::streamnccl::throwNcclError(nccl, streamnccl_result_, function, who, comm, __FILE__, \
                                   __LINE__);                                               \
    }                                                                                       \
  } while (0)

}  // namespace streamnccl
