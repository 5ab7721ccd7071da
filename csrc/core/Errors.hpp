#pragma once

// The project's three kinds of failure, and the only macros that raise them:
//   - a bad argument: STREAMNCCL_CHECK_ARG / STREAMNCCL_CHECK_TYPE, raised at the call, naming
//     the op, the argument and what was expected; the process group stays usable;
//   - a communication fault or timeout: throwDistBackendError, which Python sees as
//     torch.distributed.DistBackendError;
//   - a broken invariant of our own: TORCH_INTERNAL_ASSERT.
// Besides, the in-flight write detector (InflightWrites.hpp) raises a plain TORCH_CHECK
// RuntimeError at wait(), as autograd does for a saved tensor modified in place: the caller's
// error, found after the call, with nothing failed; the group stays usable.
// Every macro takes what it reports as arguments; none reads a variable from the caller's scope.

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <string>

namespace streamnccl {

// `op` is the c10d op name as users know it ("allreduce", "broadcast", ...).
#define STREAMNCCL_CHECK_ARG(cond, op, ...) \
  TORCH_CHECK_VALUE(cond, "streamnccl ", op, ": ", __VA_ARGS__)

#define STREAMNCCL_CHECK_TYPE(cond, op, ...) \
  TORCH_CHECK_TYPE(cond, "streamnccl ", op, ": ", __VA_ARGS__)

[[noreturn]] inline void throwDistBackendError(const std::string& message) {
  C10_THROW_ERROR(DistBackendError, message);
}

// A communicator's own deadline passed (Gloo's, on the host path): the group breaks as at the
// watchdog's, and getError() says TIMEOUT.
class TimeoutError : public c10::DistBackendError {
 public:
  using c10::DistBackendError::DistBackendError;
};

[[noreturn]] inline void throwTimeoutError(const std::string& message) {
  throw TimeoutError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                     message);
}

inline bool isTimeout(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// The text of an exception in flight, for wrapping it into a message of our own.
inline std::string describeException(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace streamnccl

namespace streamnccl {

// A DistBackendError as an exception_ptr, for futures and Works that report it later.
inline std::exception_ptr makeDistBackendError(const std::string& message) {
  try {
    throwDistBackendError(message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace streamnccl
