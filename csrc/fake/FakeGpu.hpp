#pragma once

// Test-only. One rank's GPU as the fakes of CUDA and NCCL (RecordingCuda, RecordingNccl) see
// it, so that the NCCL path runs on CPU tensors and the rules a real GPU would enforce, or
// silently break on, are checked (each one a model, FakeModels):
//   - streams: work runs in stream order, on the GPU's own thread (FakeNcclWorld's engine),
//     never before what it waits for; an event passes once its stream has run up to it. With
//     one hardware queue, all streams run in issue order and blocked work holds up the rest.
//   - kernels: the NCCL path's ATen kernels and NCCL kernels are stream items that read and
//     write memory when they run; an NCCL kernel runs when its peers' matching kernels do.
//   - memory (FakeMemory): every buffer a kernel uses must still be held when it runs, unless
//     freed on the kernel's own stream (stream-ordered reuse is safe).
//   - devices: each thread has a current device (none when it starts); a CUDA call on a
//     thread without one makes a context on device 0, and every call is checked against the
//     device of its stream, event or communicator.
//   - capture: a stream can be captured into a graph (global, thread-local or relaxed mode);
//     streams that wait on its events join the capture; captured events cannot be queried; a
//     query that the thread's capture mode prohibits invalidates the capture; a captured
//     stream may not wait on work outside the capture; captured kernels keep their buffers,
//     allocations come from the graph's private pool, and replays run the kernels again.
//   - errors: CUDA calls can be made to fail, once or for good (a sticky error).
// Broken rules are violations in the log (CallLog::takeViolations); calls the real runtime
// would fail throw as it would. Everything here runs under the world's lock. Streams, events
// and each thread's state are in FakeGpu.cpp, kernels in FakeGpuKernels.cpp, capture in
// FakeGpuCapture.cpp.

#include "core/Device.hpp"
#include "cuda/CudaApi.hpp"
#include "fake/CallLog.hpp"
#include "fake/FakeModels.hpp"
#include "fake/FakeStreamItem.hpp"

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace streamnccl::fake {

class FakeNcclWorld;

// A test's read of a tensor on a stream: the value once the stream has run up to it.
class FakeRead {
 public:
  void set(at::Tensor value);
  // The value, or an undefined tensor if the stream has not got there within `timeout`.
  at::Tensor value(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::optional<at::Tensor> value_;
};

class FakeGpu {
 public:
  FakeGpu(std::shared_ptr<FakeNcclWorld> world, int deviceIndex, int computeCapability);
  ~FakeGpu();
  FakeGpu(const FakeGpu&) = delete;
  FakeGpu& operator=(const FakeGpu&) = delete;

  CallLog& log() { return log_; }
  FakeNcclWorld& world() { return *world_; }
  const FakeModels& models() const;
  int deviceIndex() const { return deviceIndex_; }
  int computeCapability() const { return computeCapability_; }
  // The NCCL version ncclGetVersion reports (NCCL_VERSION_CODE until set): a test stands for
  // an older NCCL with it.
  int ncclVersion() const { return ncclVersion_.load(); }
  void setNcclVersion(int version) { ncclVersion_.store(version); }
  // The fake's index for `device`: the CPU tensors of a recorded group live on this GPU.
  int indexOf(const c10::Device& device) const;

  // --- each thread's state, as the CUDA runtime keeps it
  // The calling thread's current device, or -1 before it has one.
  static int currentDevice();
  static void forgetCurrentDevice();
  // cudaSetDevice (-1: back to none, as c10's guard leaves a thread that had none). A device
  // made current gets a context.
  void setCurrentDevice(int index);
  // The same, after a scope, without failing (as c10's guard restores a device).
  static void restoreCurrentDevice(int index);
  // A call that needs a device, on a thread without one: it gets device 0, and a context there.
  void bindDevice();
  StreamId currentStream() const;
  StreamId exchangeCurrentStream(StreamId stream);
  cudaStreamCaptureMode exchangeCaptureMode(cudaStreamCaptureMode mode);
  static cudaStreamCaptureMode captureModeOfThread();
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
  // cudaEventQuery: Unanswered where a capture forbids it (and the query invalidates the
  // capture where CUDA would); throws for an injected CUDA error.
  CudaApi::EventStatus queryEvent(EventId event);
  // How many cudaEventQuery calls the calling thread has made, on any fake GPU: what a launch
  // looks at of the ops in flight, apart from the watchdog's thread.
  static uint64_t queriesOfThread();
  // cudaEventElapsedTime: throws where the runtime would fail it (an event without timing,
  // one not recorded or not yet passed, one of a capture). Fake time: 1 us per stream item.
  float elapsedMs(EventId start, EventId end);
  bool isCapturing(StreamId stream) const;

  // --- kernels
  Buffer buffer(const void* pointer, const char* role) const;
  // An ATen kernel of the NCCL path, on the calling thread's current stream.
  void launchAten(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                  c10::ArrayRef<at::Tensor> inputs, int64_t scalar);
  // An NCCL kernel, on `stream` now: it runs when the stream, and its peers, get there.
  void launchNccl(StreamId stream, std::shared_ptr<NcclLaunch> launch, std::vector<Buffer> buffers);
  // ncclCommAbort: this member's kernels of `comm` that have not run exit at once, moving
  // nothing; until now they used their buffers, which must have been held.
  void stopLaunches(uint64_t comm, int rank);
  // Whether this member still has kernels of `comm` queued (ncclCommFinalize's flush).
  bool hasLaunches(uint64_t comm, int rank) const;
  // Whether one of those still queued has a buffer that starts in [begin, end).
  bool launchUses(uint64_t comm, int rank, uintptr_t begin, uintptr_t end) const;
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
  // The next call of `call` (cudaEventQuery, cudaEventElapsedTime, cudaSetDevice,
  // cudaThreadExchangeStreamCaptureMode, ...) fails with `error`; a sticky error fails every
  // CUDA call from then on, as a corrupted context does.
  void failCuda(const std::string& call, const std::string& error, bool sticky);

  // --- test controls
  // Starts capturing the calling thread's current stream into a graph.
  void beginCapture(cudaStreamCaptureMode mode);
  // Ends it: "ok", or why the graph would be unusable ("invalidated: ..." or "unjoined: S1").
  // A usable graph is kept, as number lastGraph().
  std::string endCapture();
  int lastGraph() const;
  // Runs graph `graph` on the calling thread's current stream: its kernels run again, on
  // streams of the replay's own, ordered as they were captured.
  void replay(int graph);
  // cudaGraphDestroy: the communicators it has work on are free of it.
  void destroyGraph(int graph);
  // While held, nothing runs on this GPU: the work issued since looks stuck.
  void hold(bool held);
  // While held, a shrink or split of a communicator of this GPU stays in progress (NCCL's
  // thread making the new one has not finished), however long the caller polls.
  void holdShrinks(bool held) { shrinksHeld_.store(held); }
  bool shrinksHeld() const { return shrinksHeld_.load(); }
  // Waits until this GPU's streams have run everything (false if they are stuck: `timeout`).
  bool synchronize(std::chrono::milliseconds timeout);
  // A user's own kernels on the calling thread's current stream: a read of `tensor`, and a
  // write of `value` into it.
  std::shared_ptr<FakeRead> read(const at::Tensor& tensor);
  void write(const at::Tensor& tensor, double value);
  // What ran, in order: "S1 ncclAllReduce", "S1 copy_", ...
  std::vector<std::string> ran() const;
  // The NCCL path asked for a future naming `device` (CudaApi::futureDevices): noted, with the
  // calling thread's current stream (where c10 would record the future's events once it is
  // completed), since a future over the fake's CPU tensors cannot name it.
  void noteFutureDevice(const c10::Device& device);
  // The current stream at each such request, in order.
  std::vector<StreamId> futureStreams() const;

 private:
  friend class FakeNcclWorld;

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
    uint64_t capturedCount = 0;  // items on its stream in the capture when recorded
    bool timing = false;
  };
  // An item of a capture, on its stream; a wait on a captured event names the event's stream
  // and its count of captured items then.
  struct CapturedItem {
    StreamId stream = 0;
    Item item;
    std::optional<std::pair<StreamId, uint64_t>> waitOnCaptured;
  };
  struct Capture {
    StreamId origin = 0;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;
    std::string invalidated;
    uint64_t pool = 0;
    std::map<StreamId, uint64_t> items;     // per captured stream, items captured on it
    std::map<StreamId, uint64_t> joinedAt;  // per joined stream, items it rejoined after
    std::vector<CapturedItem> captured;
  };
  struct Graph {
    uint64_t pool = 0;
    StreamId origin = 0;
    std::vector<CapturedItem> items;
    std::set<std::pair<uint64_t, int>> communicators;  // (comm, rank) it has work on
  };
  // Where the streams a replay runs on are numbered from: a graph's own, apart from the
  // streams a program creates.
  static constexpr StreamId kGraphStreams = 1000000;

  Stream& stream(StreamId id);
  void checkAlive(StreamId id, const std::string& call);
  std::string name(StreamId id) const { return "S" + std::to_string(id); }
  // Throws the error a test asked `call` to fail with, if any.
  void checkCudaFault(const std::string& call);
  // Puts `item` on `stream`, or into the capture when the stream is captured.
  void push(StreamId stream, Item item,
            std::optional<std::pair<StreamId, uint64_t>> waitOnCaptured = std::nullopt);
  bool capturedLocked(StreamId stream) const;
  // A potentially unsafe call (cudaEventQuery): false, and the capture invalidated, where the
  // calling thread's capture mode prohibits it.
  bool unsafeCallAllowed(const char* call);
  // Poisons a freed block when its stream gets to the free (FakeMemory::PoisonLater).
  void poisonLater(const FakeMemory::Owner& owner, uint8_t* data, uint64_t generation);
  // The allocation owner of the calling thread with `stream` current.
  FakeMemory::Owner ownerFor(StreamId stream) const;

  // --- the engine's side (FakeNcclWorld, with the world's lock held)
  // The items that may run next: each stream's first, or with one hardware queue the
  // earliest issued of them. None while held.
  std::vector<std::pair<StreamId, const Item*>> heads() const;
  // Runs the first item of `stream` if it can run alone (not an NCCL kernel with peers to
  // wait for); true if it ran.
  bool runHead(StreamId stream);
  // Takes the first item of `stream` off as run (an NCCL kernel its peers ran with).
  void popHead(StreamId stream);
  // Checks every buffer of `item` running on `stream` (`until`: what it did); false if one
  // is gone for good (its memory returned to the system), so the item must not touch it.
  bool checkBuffers(StreamId stream, const Item& item, const char* until);
  bool idle() const;

  const std::shared_ptr<FakeNcclWorld> world_;
  const uint64_t serial_;  // keys the threads' current streams, which are per GPU
  const int deviceIndex_;
  const int computeCapability_;
  std::atomic<int> ncclVersion_{NCCL_VERSION_CODE};
  CallLog log_;
  std::map<StreamId, Stream> streams_;
  std::map<EventId, Event> events_;
  StreamId streamsMade_ = 0;  // S0 is the device's default stream
  EventId eventsMade_ = 0;
  uint64_t issued_ = 0;
  std::optional<Capture> capture_;
  uint64_t poolsMade_ = 0;
  std::map<int, Graph> graphs_;
  std::set<int> contexts_;
  std::map<StreamId, std::string> enqueueInProgress_;
  std::set<StreamId> destroyed_;
  bool held_ = false;
  std::atomic<bool> shrinksHeld_{false};
  std::map<std::string, std::string> cudaFaults_;  // call -> error, once
  std::string stickyFault_;
  std::vector<std::string> ran_;
  std::vector<StreamId> futureStreams_;  // see noteFutureDevice()
  uint64_t replaysMade_ = 0;
  StreamId graphStreamsMade_ = 0;
  // Per replay and block: the latest allocation of the block a replayed item has used. A
  // later capture's allocation of the same memory must not be used before an earlier one's.
  std::map<std::pair<uint64_t, uintptr_t>, uint64_t> replayUses_;
};

}  // namespace streamnccl::fake
