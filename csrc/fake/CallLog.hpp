#pragma once

// Test-only. What the fakes of CUDA and NCCL write down, and what tests inject through them:
// each call in order, the buffers each NCCL call was given, and every violation of the rules
// a GPU would enforce or break on (FakeGpu). Handles are named by creation: streams S0 (a
// device's default stream) and S1.., events E1.., communicators C0.., PreMulSum ops R0..

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace streamnccl::fake {

// The memory an NCCL data call was handed.
struct BufferRecord {
  std::string call;  // e.g. "ncclAllGather"
  uintptr_t send = 0;
  uintptr_t recv = 0;
  size_t bytes = 0;  // of the send buffer (the recv buffer for ncclRecv)
};

class CallLog {
 public:
  void add(std::string call);
  std::vector<std::string> calls() const;
  void clear();  // calls and buffers; violations stay until read
  // Off, calls and buffers are not written down (violations still are): what a benchmark of
  // the launch path over the fakes wants, whose log would otherwise grow with every op.
  void setRecording(bool on) { recording_.store(on, std::memory_order_relaxed); }

  void addBuffers(BufferRecord record);
  std::vector<BufferRecord> buffers() const;

  // A rule the GPU would enforce was broken (a buffer freed before its kernel ran, a call on
  // the wrong device or stream, ...). Collected, not raised: the watchdog thread must not die
  // of it, and tests read them all at the end.
  void violation(std::string what);
  std::vector<std::string> takeViolations();

  // The next call of `function` (an NCCL name, e.g. "ncclAllReduce") fails with
  // ncclInternalError, and ncclGetLastError then says so.
  void failNext(std::string function);
  bool takeFailure(const std::string& function);
  // The next call of `function` returns ncclInProgress, as on a non-blocking communicator,
  // and its communicator stays busy for `polls` calls of ncclCommGetAsyncError.
  void inProgressNext(std::string function, int polls);
  int takeInProgress(const std::string& function);

 private:
  std::atomic<bool> recording_{true};
  mutable std::mutex mutex_;
  std::vector<std::string> calls_;
  std::vector<BufferRecord> buffers_;
  std::vector<std::string> violations_;
  std::vector<std::string> failing_;
  std::map<std::string, int> inProgress_;
};

}  // namespace streamnccl::fake
