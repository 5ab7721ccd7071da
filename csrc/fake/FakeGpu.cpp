#include "fake/FakeGpu.hpp"

#include "fake/FakeGpuShared.hpp"
#include "fake/FakeNcclWorld.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>

namespace streamnccl::fake {
namespace {

// Each thread's runtime state, as the CUDA runtime and c10 keep it per thread.
thread_local int currentDeviceOfThread = -1;
thread_local cudaStreamCaptureMode captureModeOfCallingThread = cudaStreamCaptureModeGlobal;
thread_local uint64_t queriesOfCallingThread = 0;
// Per fake GPU (by serial number): the thread's current stream; absent means S0.
thread_local std::map<uint64_t, StreamId> currentStreamOfThread;

std::atomic<uint64_t> gpusMade{0};

using detail::deviceName;
using detail::Lock;

}  // namespace

TensorView TensorView::of(const at::Tensor& tensor) {
  return TensorView{tensor.data_ptr(), tensor.sizes().vec(), tensor.strides().vec(),
                    tensor.scalar_type()};
}

at::Tensor TensorView::view() const {
  return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
}

void FakeRead::set(at::Tensor value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    value_ = std::move(value);
  }
  done_.notify_all();
}

at::Tensor FakeRead::value(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_.wait_for(lock, timeout, [&] { return value_.has_value(); })) {
    return {};
  }
  return *value_;
}

FakeGpu::FakeGpu(std::shared_ptr<FakeNcclWorld> world, int deviceIndex, int computeCapability)
    : world_(std::move(world)),
      serial_(++gpusMade),
      deviceIndex_(deviceIndex),
      computeCapability_(computeCapability) {
  world_->addGpu(this);
  // The creating thread's tensors are this GPU's, on its default stream, until it uses another.
  FakeMemory::setAllocationOwner(FakeMemory::Owner{serial_, 0, 0});
  if (models().memory) {
    FakeMemory::instance().attach(
        serial_, [this](const FakeMemory::Owner& owner, uint8_t* data, uint64_t generation) {
          poisonLater(owner, data, generation);
        });
  }
}

FakeGpu::~FakeGpu() {
  for (const auto& [number, graph] : graphs_) {  // its graphs go with it
    for (const auto& [comm, rank] : graph.communicators) {
      world_->holdForGraph(comm, rank, -1);
    }
  }
  if (models().memory) {
    FakeMemory::instance().detach(serial_);
  }
  world_->removeGpu(this);
  currentStreamOfThread.erase(serial_);
}

const FakeModels& FakeGpu::models() const { return world_->models(); }

int FakeGpu::indexOf(const c10::Device& device) const {
  return device.is_cuda() && device.has_index() ? device.index() : deviceIndex_;
}

// --- each thread's state

int FakeGpu::currentDevice() { return currentDeviceOfThread; }
void FakeGpu::forgetCurrentDevice() { currentDeviceOfThread = -1; }

void FakeGpu::setCurrentDevice(int index) {
  Lock lock(world_->mutex());
  if (index >= 0) {
    checkCudaFault("cudaSetDevice");
  }
  if (index >= 0 && FakeMemory::allocationOwner().gpu != serial_) {
    // The thread works on this GPU now: its tensors come from its current stream here.
    FakeMemory::setAllocationOwner(ownerFor(currentStream()));
  }
  currentDeviceOfThread = index;
  if (index >= 0 && models().devices) {
    contexts_.insert(index);
  }
}

void FakeGpu::restoreCurrentDevice(int index) { currentDeviceOfThread = index; }

void FakeGpu::bindDevice() {
  if (currentDeviceOfThread < 0) {
    setCurrentDevice(0);  // what the runtime does for a thread that set no device
  }
}

std::set<int> FakeGpu::contexts() const {
  Lock lock(world_->mutex());
  return contexts_;
}

StreamId FakeGpu::currentStream() const {
  auto found = currentStreamOfThread.find(serial_);
  return found == currentStreamOfThread.end() ? 0 : found->second;
}

StreamId FakeGpu::exchangeCurrentStream(StreamId stream) {
  Lock lock(world_->mutex());
  const StreamId previous = currentStream();
  currentStreamOfThread[serial_] = stream;
  FakeMemory::setAllocationOwner(ownerFor(stream));  // ATen's allocations come from it now
  return previous;
}

FakeMemory::Owner FakeGpu::ownerFor(StreamId stream) const {
  return FakeMemory::Owner{serial_, stream, capturedLocked(stream) ? capture_->pool : 0};
}

cudaStreamCaptureMode FakeGpu::captureModeOfThread() { return captureModeOfCallingThread; }

cudaStreamCaptureMode FakeGpu::exchangeCaptureMode(cudaStreamCaptureMode mode) {
  {
    Lock lock(world_->mutex());
    checkCudaFault("cudaThreadExchangeStreamCaptureMode");
  }
  return std::exchange(captureModeOfCallingThread, mode);
}

void FakeGpu::failCuda(const std::string& call, const std::string& error, bool sticky) {
  Lock lock(world_->mutex());
  cudaFaults_[call] = (sticky ? "!" : "") + error;
}

void FakeGpu::checkCudaFault(const std::string& call) {
  if (!models().cudaErrors) {
    return;
  }
  std::string error = stickyFault_;
  if (error.empty()) {
    auto found = cudaFaults_.find(call);
    if (found == cudaFaults_.end()) {
      return;
    }
    error = found->second;
    cudaFaults_.erase(found);
    if (error.front() == '!') {  // sticky: the context is corrupted for good
      error.erase(0, 1);
      stickyFault_ = error;
    }
  }
  log_.add(call + " failed: " + error);
  TORCH_CHECK(false, "CUDA error: ", error, " (", call, ")");
}

// --- streams and events

FakeGpu::Stream& FakeGpu::stream(StreamId id) {
  auto [found, made] = streams_.try_emplace(id);
  if (made) {
    found->second.device = deviceIndex_;  // S0, or a stream a test made current
  }
  return found->second;
}

StreamId FakeGpu::createStream(bool highPriority) {
  bindDevice();
  Lock lock(world_->mutex());
  checkCudaFault("cudaStreamCreateWithPriority");
  const StreamId id = ++streamsMade_;
  streams_[id].device = currentDeviceOfThread;
  log_.add("cudaStreamCreateWithPriority(" + std::string(highPriority ? "high" : "low") + ") -> " +
           name(id));
  return id;
}

void FakeGpu::destroyStream(StreamId id) {
  Lock lock(world_->mutex());
  log_.add("cudaStreamDestroy(" + name(id) + ")");
  checkAlive(id, "cudaStreamDestroy");
  destroyed_.insert(id);  // its queued work still runs, as CUDA frees it after that
}

void FakeGpu::checkAlive(StreamId id, const std::string& call) {
  if (destroyed_.count(id) > 0) {
    log_.violation(call + " on " + name(id) + " after cudaStreamDestroy freed it");
  }
}

EventId FakeGpu::createEvent(bool timing) {
  bindDevice();
  Lock lock(world_->mutex());
  checkCudaFault("cudaEventCreate");
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
  Lock lock(world_->mutex());
  const std::string call = "cudaEventRecord(E" + std::to_string(id) + ", " + name(streamId) + ")";
  checkCudaFault("cudaEventRecord");
  log_.add(call);
  checkAlive(streamId, call);
  Stream& recordedOn = stream(streamId);
  Event& event = events_[id];
  if (models().devices && recordedOn.device != currentDeviceOfThread) {
    log_.violation(call + ": " + name(streamId) + " is on " + deviceName(recordedOn.device) +
                   " but the calling thread's current device is " +
                   deviceName(currentDeviceOfThread));
  }
  if (models().devices && event.device != recordedOn.device) {
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
    event.capturedCount = capture_->items[streamId];
  } else {
    event.position = recordedOn.enqueued;
  }
}

void FakeGpu::streamWaitEvent(StreamId streamId, EventId id) {
  bindDevice();
  Lock lock(world_->mutex());
  const std::string call =
      "cudaStreamWaitEvent(" + name(streamId) + ", E" + std::to_string(id) + ")";
  checkCudaFault("cudaStreamWaitEvent");
  log_.add(call);
  checkAlive(streamId, call);
  Stream& waiting = stream(streamId);
  if (models().devices && waiting.device != currentDeviceOfThread) {
    log_.violation(call + ": " + name(streamId) + " is on " + deviceName(waiting.device) +
                   " but the calling thread's current device is " +
                   deviceName(currentDeviceOfThread));
  }
  const Event event = events_[id];
  if (!event.stream) {
    return;  // never recorded: nothing to wait for
  }
  if (event.captured) {
    if (!capture_) {
      return;  // its capture has ended: a graph node, nothing to wait for here
    }
    if (streamId == capture_->origin && *event.stream != capture_->origin) {
      // The fork joins the origin stream again, after the items it had when recorded.
      auto& joined = capture_->joinedAt[*event.stream];
      joined = std::max(joined, event.capturedCount);
    }
    capture_->items.try_emplace(streamId, 0);  // a stream that waits joins the capture
    Item wait;
    wait.kind = Item::Kind::Wait;
    wait.name = "wait";
    push(streamId, std::move(wait), std::make_pair(*event.stream, event.capturedCount));
    return;
  }
  if (capturedLocked(streamId)) {
    // Only in-stream order may cross a capture's boundary: a captured stream waiting on work
    // outside the capture would make the graph depend on it.
    if (capture_->invalidated.empty()) {
      capture_->invalidated = call +
                              ": a captured stream waited on an event recorded outside "
                              "the capture";
    }
    TORCH_CHECK(false,
                "CUDA error: operation would make the capture depend on work outside it "
                "(cudaErrorStreamCaptureIsolation): ",
                call);
  }
  Item wait;
  wait.kind = Item::Kind::Wait;
  wait.name = "wait";
  wait.waitStream = *event.stream;
  wait.waitPosition = event.position;
  push(streamId, std::move(wait));
}

uint64_t FakeGpu::queriesOfThread() { return queriesOfCallingThread; }

CudaApi::EventStatus FakeGpu::queryEvent(EventId id) {
  using Status = CudaApi::EventStatus;
  ++queriesOfCallingThread;
  bindDevice();
  std::unique_lock<std::recursive_mutex> lock(world_->mutex());
  checkCudaFault("cudaEventQuery");
  if (!unsafeCallAllowed("cudaEventQuery")) {
    return Status::Unanswered;  // cudaErrorStreamCaptureUnsupported
  }
  const Event event = events_[id];
  if (event.captured) {
    log_.add("cudaEventQuery(E" + std::to_string(id) +
             ") failed: the event was last recorded "
             "in a capturing stream (cudaErrorCapturedEvent)");
    return Status::Unanswered;
  }
  if (models().devices && event.device != currentDeviceOfThread) {
    log_.violation("cudaEventQuery(E" + std::to_string(id) + ") of " + deviceName(event.device) +
                   " on a thread whose current device is " + deviceName(currentDeviceOfThread));
  }
  if (!event.stream) {
    return Status::Passed;
  }
  if (!models().progress) {
    world_->advance();  // without a thread of its own, the GPU runs when asked
  }
  return stream(*event.stream).ran >= event.position ? Status::Passed : Status::Pending;
}

float FakeGpu::elapsedMs(EventId startId, EventId endId) {
  bindDevice();
  Lock lock(world_->mutex());
  const std::string call =
      "cudaEventElapsedTime(E" + std::to_string(startId) + ", E" + std::to_string(endId) + ")";
  checkCudaFault("cudaEventElapsedTime");
  log_.add(call);
  const Event& start = events_[startId];
  const Event& end = events_[endId];
  TORCH_CHECK(start.timing && end.timing, "CUDA error: invalid resource handle ",
              "(cudaErrorInvalidResourceHandle): ", call, " of an event made without timing");
  TORCH_CHECK(start.stream && end.stream, "CUDA error: invalid resource handle ",
              "(cudaErrorInvalidResourceHandle): ", call, " of an event never recorded");
  TORCH_CHECK(!start.captured && !end.captured, "CUDA error: operation not permitted on an ",
              "event last recorded in a capturing stream (cudaErrorCapturedEvent): ", call);
  if (models().devices &&
      (start.device != currentDeviceOfThread || end.device != currentDeviceOfThread)) {
    log_.violation(call + " on a thread whose current device is " +
                   deviceName(currentDeviceOfThread));
  }
  const bool passed =
      stream(*start.stream).ran >= start.position && stream(*end.stream).ran >= end.position;
  TORCH_CHECK(passed, "CUDA error: device not ready (cudaErrorNotReady): ", call);
  return 0.001f *
         static_cast<float>(end.position > start.position ? end.position - start.position : 0);
}

// --- test controls

void FakeGpu::hold(bool held) {
  Lock lock(world_->mutex());
  held_ = held;
  world_->notify();
}

bool FakeGpu::synchronize(std::chrono::milliseconds timeout) {
  std::unique_lock<std::recursive_mutex> lock(world_->mutex());
  return world_->waitUntil(lock, timeout, [&] { return idle(); });
}

std::shared_ptr<FakeRead> FakeGpu::read(const at::Tensor& tensor) {
  auto read = std::make_shared<FakeRead>();
  Item item;
  item.kind = Item::Kind::Host;
  item.name = "read";
  item.buffers.push_back(buffer(tensor.data_ptr(), "read"));
  item.host = [read, view = TensorView::of(tensor)] { read->set(view.view().clone()); };
  Lock lock(world_->mutex());
  push(currentStream(), std::move(item));
  return read;
}

void FakeGpu::write(const at::Tensor& tensor, double value) {
  Item item;
  item.kind = Item::Kind::Host;
  item.name = "write";
  item.buffers.push_back(buffer(tensor.data_ptr(), "written"));
  item.host = [view = TensorView::of(tensor), value] { view.view().fill_(value); };
  Lock lock(world_->mutex());
  push(currentStream(), std::move(item));
}

std::vector<std::string> FakeGpu::ran() const {
  Lock lock(world_->mutex());
  return ran_;
}

void FakeGpu::noteFutureDevice(const c10::Device& device) {
  Lock lock(world_->mutex());
  if (indexOf(device) == deviceIndex_) {
    futureStreams_.push_back(currentStream());
  }
}

std::vector<StreamId> FakeGpu::futureStreams() const {
  Lock lock(world_->mutex());
  return futureStreams_;
}

}  // namespace streamnccl::fake
