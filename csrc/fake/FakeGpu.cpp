#include "fake/FakeGpu.hpp"

#include <c10/util/Exception.h>

#include <atomic>

namespace streamnccl::fake {
namespace {

// Each thread's runtime state, as the CUDA runtime and c10 keep it per thread.
thread_local int currentDeviceOfThread = -1;
thread_local cudaStreamCaptureMode captureModeOfThread = cudaStreamCaptureModeGlobal;
// Per fake GPU (by serial number): the thread's current stream; absent means S0.
thread_local std::map<uint64_t, StreamId> currentStreamOfThread;

std::atomic<uint64_t> gpusMade{0};

std::string deviceName(int index) { return "cuda:" + std::to_string(index); }

const char* modeName(cudaStreamCaptureMode mode) {
  switch (mode) {
    case cudaStreamCaptureModeGlobal:
      return "global";
    case cudaStreamCaptureModeThreadLocal:
      return "thread_local";
    case cudaStreamCaptureModeRelaxed:
      return "relaxed";
  }
  return "unknown";
}

}  // namespace

FakeGpu::FakeGpu(int deviceIndex, int computeCapability)
    : serial_(++gpusMade), deviceIndex_(deviceIndex), computeCapability_(computeCapability) {
  FakeMemory::instance().arm();
}

FakeGpu::~FakeGpu() {
  FakeMemory::instance().disarm();
  currentStreamOfThread.erase(serial_);
}

int FakeGpu::indexOf(const c10::Device& device) const {
  return device.is_cuda() && device.has_index() ? device.index() : deviceIndex_;
}

int FakeGpu::currentDevice() { return currentDeviceOfThread; }
void FakeGpu::forgetCurrentDevice() { currentDeviceOfThread = -1; }

void FakeGpu::setCurrentDevice(int index) {
  currentDeviceOfThread = index;
  if (index >= 0) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    contexts_.insert(index);
  }
}

void FakeGpu::bindDevice() {
  if (currentDeviceOfThread < 0) {
    setCurrentDevice(0);  // what the runtime does for a thread that set no device
  }
}

std::set<int> FakeGpu::contexts() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return contexts_;
}

StreamId FakeGpu::currentStream() const {
  auto found = currentStreamOfThread.find(serial_);
  return found == currentStreamOfThread.end() ? 0 : found->second;
}

StreamId FakeGpu::exchangeCurrentStream(StreamId stream) {
  const StreamId previous = currentStream();
  currentStreamOfThread[serial_] = stream;
  FakeMemory::setAllocationStream(stream);  // ATen's allocations now come from this stream
  return previous;
}

cudaStreamCaptureMode FakeGpu::exchangeCaptureMode(cudaStreamCaptureMode mode) {
  return std::exchange(captureModeOfThread, mode);
}

FakeGpu::Stream& FakeGpu::stream(StreamId id) {
  auto [found, made] = streams_.try_emplace(id);
  if (made) {
    found->second.device = deviceIndex_;  // S0, or a stream a test made current
  }
  return found->second;
}

StreamId FakeGpu::createStream(bool highPriority) {
  bindDevice();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const StreamId id = ++streamsMade_;
  streams_[id].device = currentDeviceOfThread;
  log_.add("cudaStreamCreateWithPriority(" + std::string(highPriority ? "high" : "low") + ") -> " +
           name(id));
  return id;
}

void FakeGpu::destroyStream(StreamId id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  log_.add("cudaStreamDestroy(" + name(id) + ")");
  checkAlive(id, "cudaStreamDestroy");
  destroyed_.insert(id);
}

void FakeGpu::checkAlive(StreamId id, const std::string& call) {
  if (destroyed_.count(id) > 0) {
    log_.violation(call + " on " + name(id) + " after cudaStreamDestroy freed it");
  }
}

EventId FakeGpu::createEvent(bool timing) {
  bindDevice();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const EventId id = ++eventsMade_;
  events_[id].device = currentDeviceOfThread;
  events_[id].timing = timing;
  log_.add(std::string(timing ? "cudaEventCreate(timing)" : "cudaEventCreate()") + " -> E" +
           std::to_string(id));
  return id;
}

void FakeGpu::destroyEvent(EventId /*event*/) {}

void FakeGpu::recordEvent(EventId id, StreamId streamId) {
  bindDevice();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const std::string call = "cudaEventRecord(E" + std::to_string(id) + ", " + name(streamId) + ")";
  log_.add(call);
  checkAlive(streamId, call);
  Stream& recordedOn = stream(streamId);
  Event& event = events_[id];
  if (recordedOn.device != currentDeviceOfThread) {
    log_.violation(call + ": " + name(streamId) + " is on " + deviceName(recordedOn.device) +
                   " but the calling thread's current device is " +
                   deviceName(currentDeviceOfThread));
  }
  if (event.device != recordedOn.device) {
    log_.violation(call + ": the event belongs to " + deviceName(event.device) +
                   ", the stream to " + deviceName(recordedOn.device));
  }
  if (auto enqueuing = enqueueInProgress_.find(streamId); enqueuing != enqueueInProgress_.end()) {
    log_.violation(call + " while " + enqueuing->second + " on " + name(streamId) +
                   " was still being enqueued (ncclInProgress): the event passes before it");
  }
  event.stream = streamId;
  event.captured = capturedLocked(streamId);
  if (event.captured) {
    event.capturedKernels = capture_->kernels[streamId];
  } else {
    event.position = recordedOn.enqueued;
  }
}

void FakeGpu::streamWaitEvent(StreamId streamId, EventId id) {
  bindDevice();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const std::string call =
      "cudaStreamWaitEvent(" + name(streamId) + ", E" + std::to_string(id) + ")";
  log_.add(call);
  checkAlive(streamId, call);
  Stream& waiting = stream(streamId);
  if (waiting.device != currentDeviceOfThread) {
    log_.violation(call + ": " + name(streamId) + " is on " + deviceName(waiting.device) +
                   " but the calling thread's current device is " +
                   deviceName(currentDeviceOfThread));
  }
  const Event& event = events_[id];
  if (!event.stream) {
    return;  // never recorded: nothing to wait for
  }
  if (event.captured && capture_) {
    if (streamId == capture_->origin && *event.stream != capture_->origin) {
      // The fork joins the origin stream again, after the kernels it had when recorded.
      auto& joined = capture_->joinedAt[*event.stream];
      joined = std::max(joined, event.capturedKernels);
    }
    capture_->kernels.try_emplace(streamId, 0);  // a stream that waits joins the capture
    return;
  }
  if (capturedLocked(streamId)) {
    return;  // a graph node depending on work outside the graph: allowed
  }
  waiting.pending.push_back(Item{Item::Kind::Wait, "", "", {}, *event.stream, event.position});
  ++waiting.enqueued;
}

bool FakeGpu::queryEvent(EventId id) {
  bindDevice();
  checkUnsafeCall("cudaEventQuery");
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const Event& event = events_[id];
  TORCH_CHECK(!event.captured,
              "CUDA error: operation not permitted on an event last recorded in a capturing "
              "stream (cudaErrorCapturedEvent), querying E",
              id);
  if (event.device != currentDeviceOfThread) {
    log_.violation("cudaEventQuery(E" + std::to_string(id) + ") of " + deviceName(event.device) +
                   " on a thread whose current device is " + deviceName(currentDeviceOfThread));
  }
  if (!event.stream) {
    return true;
  }
  if (log_.eventsHeld()) {
    return false;
  }
  runUpTo(*event.stream, event.position);
  return true;
}

float FakeGpu::elapsedMs(EventId startId, EventId endId) {
  bindDevice();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const std::string call =
      "cudaEventElapsedTime(E" + std::to_string(startId) + ", E" + std::to_string(endId) + ")";
  log_.add(call);
  const Event& start = events_[startId];
  const Event& end = events_[endId];
  TORCH_CHECK(start.timing && end.timing, "CUDA error: invalid resource handle ",
              "(cudaErrorInvalidResourceHandle): ", call, " of an event made without timing");
  TORCH_CHECK(start.stream && end.stream, "CUDA error: invalid resource handle ",
              "(cudaErrorInvalidResourceHandle): ", call, " of an event never recorded");
  TORCH_CHECK(!start.captured && !end.captured, "CUDA error: operation not permitted on an ",
              "event last recorded in a capturing stream (cudaErrorCapturedEvent): ", call);
  if (start.device != currentDeviceOfThread || end.device != currentDeviceOfThread) {
    log_.violation(call + " on a thread whose current device is " +
                   deviceName(currentDeviceOfThread));
  }
  const bool passed =
      stream(*start.stream).ran >= start.position && stream(*end.stream).ran >= end.position;
  TORCH_CHECK(passed, "CUDA error: device not ready (cudaErrorNotReady): ", call);
  return 0.001f *
         static_cast<float>(end.position > start.position ? end.position - start.position : 0);
}

void FakeGpu::checkUnsafeCall(const char* call) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!capture_) {
    return;
  }
  const cudaStreamCaptureMode mode = captureModeOfThread;
  const bool own = capture_->thread == std::this_thread::get_id();
  const bool prohibited =
      own ? mode != cudaStreamCaptureModeRelaxed && capture_->mode != cudaStreamCaptureModeRelaxed
          : mode == cudaStreamCaptureModeGlobal && capture_->mode == cudaStreamCaptureModeGlobal;
  if (!prohibited) {
    return;
  }
  if (capture_->invalidated.empty()) {
    capture_->invalidated =
        std::string(call) + (own ? " on the capturing thread"
                                 : " from another thread in global capture mode, during a "
                                   "global-mode capture");
  }
  TORCH_CHECK(false,
              "CUDA error: operation not permitted when stream is capturing "
              "(cudaErrorStreamCaptureUnsupported): ",
              call);
}

bool FakeGpu::isCapturing(StreamId stream) const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return capturedLocked(stream);
}

bool FakeGpu::capturedLocked(StreamId stream) const {
  return capture_ && capture_->kernels.count(stream) > 0;
}

Buffer FakeGpu::buffer(const void* pointer, const char* role) const {
  return Buffer{pointer, role, FakeMemory::instance().lookup(pointer)};
}

void FakeGpu::enqueueKernel(StreamId streamId, const std::string& name, const std::string& comm,
                            std::vector<Buffer> buffers) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  checkAlive(streamId, name);
  for (const Buffer& buffer : buffers) {
    if (buffer.atCall.tracked && !buffer.atCall.live) {
      log_.violation(name + " was handed a " + buffer.role + " buffer that had been freed");
    }
  }
  if (capturedLocked(streamId)) {
    ++capture_->kernels[streamId];  // a graph node: it runs at each replay, not now
    return;
  }
  Stream& target = stream(streamId);
  target.pending.push_back(Item{Item::Kind::Kernel, name, comm, std::move(buffers), 0, 0});
  ++target.enqueued;
}

void FakeGpu::checkHeldUntilGroupEnd(const std::string& name, const std::vector<Buffer>& buffers) {
  for (const Buffer& buffer : buffers) {
    if (!buffer.atCall.tracked) {
      continue;
    }
    const auto now = FakeMemory::instance().lookup(buffer.pointer);
    if (!now.live || now.generation != buffer.atCall.generation) {
      log_.violation(name + "'s " + buffer.role +
                     " buffer was freed inside the NCCL group, before ncclGroupEnd enqueued the "
                     "call: the stream's next allocation can overwrite it first");
    }
  }
}

void FakeGpu::checkCallContext(const std::string& call, int device, StreamId streamId) {
  bindDevice();
  if (currentDeviceOfThread != device) {
    log_.violation(call + " on a communicator of " + deviceName(device) +
                   " from a thread whose current device is " + deviceName(currentDeviceOfThread));
  }
  if (currentStream() != streamId) {
    log_.violation(call + " on " + name(streamId) +
                   " while the calling thread's current stream is " + name(currentStream()) +
                   ": the op's ATen work (copies, divisions) ran on another stream");
  }
}

void FakeGpu::markEnqueueInProgress(StreamId stream, const std::string& call) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  enqueueInProgress_[stream] = call;
}

void FakeGpu::clearEnqueueInProgress(StreamId stream) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  enqueueInProgress_.erase(stream);
}

void FakeGpu::runUpTo(StreamId streamId, uint64_t position) {
  Stream& running = stream(streamId);
  while (running.ran < position && !running.pending.empty()) {
    Item item = std::move(running.pending.front());
    running.pending.pop_front();
    if (item.kind == Item::Kind::Wait) {
      runUpTo(item.waitStream, item.waitPosition);
    } else {
      runKernel(streamId, item, "ran");
    }
    ++running.ran;
  }
}

void FakeGpu::abortKernels(const std::string& comm) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto& [streamId, stream] : streams_) {
    for (Item& item : stream.pending) {
      if (item.kind == Item::Kind::Kernel && item.comm == comm) {
        runKernel(streamId, item, "was stopped by ncclCommAbort");
        item.buffers.clear();  // stopped: it touches nothing more
      }
    }
  }
}

void FakeGpu::runKernel(StreamId streamId, const Item& kernel, const char* until) {
  for (const Buffer& buffer : kernel.buffers) {
    if (!buffer.atCall.tracked) {
      continue;
    }
    const auto now = FakeMemory::instance().lookup(buffer.pointer);
    const bool heldSinceCall = now.live && now.generation == buffer.atCall.generation;
    // Memory freed and reused on the kernel's own stream is safe: later work there runs after
    // the kernel. From any other stream it is not.
    if (!heldSinceCall && buffer.atCall.stream != streamId) {
      log_.violation(kernel.name + " on " + name(streamId) + " " + until + " after its " +
                     buffer.role + " buffer (allocated on " + name(buffer.atCall.stream) +
                     ") was freed: nothing held it until then");
    }
  }
}

void FakeGpu::beginCapture(cudaStreamCaptureMode mode) {
  bindDevice();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  TORCH_CHECK(!capture_, "streamnccl fake: a capture is under way already");
  const StreamId origin = currentStream();
  capture_ = Capture{origin, mode, std::this_thread::get_id(), "", {{origin, 0}}, {}};
  log_.add("cudaStreamBeginCapture(" + name(origin) + ", " + modeName(mode) + ")");
}

std::string FakeGpu::endCapture() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  TORCH_CHECK(capture_, "streamnccl fake: no capture is under way");
  const Capture capture = std::move(*capture_);
  capture_.reset();
  log_.add("cudaStreamEndCapture(" + name(capture.origin) + ")");
  if (!capture.invalidated.empty()) {
    return "invalidated: " + capture.invalidated;
  }
  for (const auto& [streamId, kernels] : capture.kernels) {
    if (streamId == capture.origin) {
      continue;
    }
    auto joined = capture.joinedAt.find(streamId);
    if (joined == capture.joinedAt.end() || joined->second < kernels) {
      return "unjoined: " + name(streamId);
    }
  }
  return "ok";
}

}  // namespace streamnccl::fake
