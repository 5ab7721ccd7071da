#pragma once

// Test-only. One rank's GPU as the fakes of CUDA and NCCL (RecordingCuda, RecordingNccl) see
// it, so that the NCCL path runs on CPU tensors and the rules a real GPU would enforce, or
// silently break on, are checked:
//   - streams: work enqueued on a stream runs only when an event recorded after it is found
//     complete (query or synchronize); a stream that waits on an event first runs the other
//     stream up to it. While events are held nothing runs.
//   - memory (FakeMemory): when an NCCL kernel runs, every buffer it reads or writes that was
//     allocated on another stream must still be held; a grouped call's buffers must be held
//     until ncclGroupEnd, when NCCL actually enqueues it.
//   - devices: each thread has a current device (none when it starts); a CUDA call on a
//     thread without one makes a context on device 0, and every call is checked against the
//     device of its stream, event or communicator.
//   - capture: a stream can be captured into a graph (global or thread-local mode); streams
//     that wait on its events join the capture; captured events cannot be queried; a query
//     that the thread's capture mode prohibits invalidates the capture.
// Broken rules are violations in the log (CallLog::takeViolations); calls the real runtime
// would fail throw as it would.

#include "fake/CallLog.hpp"
#include "fake/FakeMemory.hpp"

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace streamnccl::fake {

using StreamId = int64_t;
using EventId = int64_t;

// The memory an NCCL call reads or writes, as FakeMemory knew it at the call.
struct Buffer {
  const void* pointer = nullptr;
  const char* role = "";  // "send", "recv", "scalar"
  FakeMemory::Block atCall;
};

class FakeGpu {
 public:
  FakeGpu(int deviceIndex, int computeCapability);
  ~FakeGpu();
  FakeGpu(const FakeGpu&) = delete;
  FakeGpu& operator=(const FakeGpu&) = delete;

  CallLog& log() { return log_; }
  int deviceIndex() const { return deviceIndex_; }
  int computeCapability() const { return computeCapability_; }
  // The fake's index for `device`: the CPU tensors of a recorded group live on this GPU.
  int indexOf(const c10::Device& device) const;

  // --- each thread's state, as the CUDA runtime keeps it
  // The calling thread's current device, or -1 before it has one.
  static int currentDevice();
  static void forgetCurrentDevice();
  // cudaSetDevice (-1: back to none, as c10's guard leaves a thread that had none). A device
  // made current gets a context.
  void setCurrentDevice(int index);
  // A call that needs a device, on a thread without one: it gets device 0, and a context there.
  void bindDevice();
  StreamId currentStream() const;
  StreamId exchangeCurrentStream(StreamId stream);
  static cudaStreamCaptureMode exchangeCaptureMode(cudaStreamCaptureMode mode);
  // The devices this GPU's calls made a context on (a process would, on each).
  std::set<int> contexts() const;

  // --- streams and events
  StreamId createStream(bool highPriority);
  void destroyStream(StreamId stream);
  // `timing`: made without cudaEventDisableTiming, so that elapsedMs() can time it.
  EventId createEvent(bool timing);
  void destroyEvent(EventId event);
  void recordEvent(EventId event, StreamId stream);
  void streamWaitEvent(StreamId stream, EventId event);
  // cudaEventQuery: throws where the runtime would fail it.
  bool queryEvent(EventId event);
  // cudaEventElapsedTime: throws where the runtime would fail it (an event without timing,
  // one not recorded or not yet passed, one of a capture). Fake time: 1 us per stream item.
  float elapsedMs(EventId start, EventId end);
  bool isCapturing(StreamId stream) const;

  // --- NCCL kernels
  Buffer buffer(const void* pointer, const char* role) const;
  // Issues `name` of communicator `comm` on `stream` now: it runs when the stream gets there.
  void enqueueKernel(StreamId stream, const std::string& name, const std::string& comm,
                     std::vector<Buffer> buffers);
  // ncclCommAbort: the communicator's kernels that have not run are stopped, never to run;
  // until then they used their buffers, which must have been held.
  void abortKernels(const std::string& comm);
  // At ncclGroupEnd: each buffer of a grouped call must still be held, since NCCL reads it
  // only now.
  void checkHeldUntilGroupEnd(const std::string& name, const std::vector<Buffer>& buffers);
  // Checks that the calling thread is on `device` with `stream` current, as every NCCL call
  // of ours must be: the ATen work of the op ran on the current stream.
  void checkCallContext(const std::string& name, int device, StreamId stream);
  // An NCCL call on `stream` returned ncclInProgress: until it is done, an event recorded on
  // the stream would pass before the call's kernel.
  void markEnqueueInProgress(StreamId stream, const std::string& call);
  void clearEnqueueInProgress(StreamId stream);

  // --- test controls
  // Starts capturing the calling thread's current stream into a graph.
  void beginCapture(cudaStreamCaptureMode mode);
  // Ends it: "ok", or why the graph would be unusable ("invalidated: ..." or "unjoined: S1").
  std::string endCapture();

 private:
  struct Item {
    enum class Kind { Kernel, Wait } kind;
    std::string name;
    std::string comm;
    std::vector<Buffer> buffers;
    StreamId waitStream = 0;  // Wait: run this stream up to `waitPosition` first
    uint64_t waitPosition = 0;
  };
  struct Stream {
    int device = 0;
    std::deque<Item> pending;
    uint64_t enqueued = 0;  // items ever enqueued; an event marks a count
    uint64_t ran = 0;
  };
  struct Event {
    int device = 0;
    std::optional<StreamId> stream;  // where it was last recorded
    uint64_t position = 0;
    bool captured = false;
    uint64_t capturedKernels = 0;  // kernels on its stream when recorded in the capture
    bool timing = false;
  };
  struct Capture {
    StreamId origin = 0;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;
    std::string invalidated;
    std::map<StreamId, uint64_t> kernels;   // per captured stream, kernels captured on it
    std::map<StreamId, uint64_t> joinedAt;  // per joined stream, kernels it rejoined after
  };

  Stream& stream(StreamId id);
  // A call naming a stream destroyed already: a use after free of the stream.
  void checkAlive(StreamId id, const std::string& call);
  std::string name(StreamId id) const { return "S" + std::to_string(id); }
  void runUpTo(StreamId stream, uint64_t position);
  void runKernel(StreamId stream, const Item& kernel, const char* until);
  bool capturedLocked(StreamId stream) const;
  // A potentially unsafe call (cudaEventQuery): fails and invalidates the capture where the
  // calling thread's capture mode prohibits it.
  void checkUnsafeCall(const char* call);

  const uint64_t serial_;  // keys the threads' current streams, which are per GPU
  const int deviceIndex_;
  const int computeCapability_;
  CallLog log_;
  mutable std::recursive_mutex mutex_;
  std::map<StreamId, Stream> streams_;
  std::map<EventId, Event> events_;
  StreamId streamsMade_ = 0;  // S0 is the device's default stream
  EventId eventsMade_ = 0;
  std::optional<Capture> capture_;
  std::set<int> contexts_;
  std::map<StreamId, std::string> enqueueInProgress_;
  std::set<StreamId> destroyed_;
};

}  // namespace streamnccl::fake
