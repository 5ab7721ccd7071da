#pragma once

#include "core/Errors.hpp"

#include <nccl.h>

#include <string>

namespace streamnccl {

// `who` says where it failed: "[streamnccl rank r/n cuda:d]".
[[noreturn]] inline void throwNcclError(ncclResult_t result, const char* call,
                                        const std::string& who, ncclComm_t comm, const char* file,
                                        int line) {
  const char* detail = ncclGetLastError(comm);
  throwDistBackendError(who + " " + call + " failed: " + ncclGetErrorString(result) +
                        (detail && *detail ? std::string(" (") + detail + ")" : "") + " at " +
                        file + ":" + std::to_string(line));
}

#define STREAMNCCL_NCCL_CHECK(call, who, comm)                                                \
  do {                                                                                        \
    const ncclResult_t streamnccl_result_ = (call);                                           \
    if (streamnccl_result_ != ncclSuccess && streamnccl_result_ != ncclInProgress) {          \
      ::streamnccl::throwNcclError(streamnccl_result_, #call, who, comm, __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)

}  // namespace streamnccl
