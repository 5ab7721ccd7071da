#include "fake/FakeGpu.hpp"

#include "fake/FakeCollectives.hpp"
#include "fake/FakeNcclWorld.hpp"

#include <ATen/ATen.h>
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

std::vector<at::Tensor> views(const std::vector<TensorView>& tensors) {
  std::vector<at::Tensor> made;
  made.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    made.push_back(tensor.view());
  }
  return made;
}

using Lock = std::lock_guard<std::recursive_mutex>;

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

cudaStreamCaptureMode FakeGpu::exchangeCaptureMode(cudaStreamCaptureMode mode) {
  {
    Lock lock(world_->mutex());
    checkCudaFault("cudaThreadExchangeStreamCaptureMode");
  }
  return std::exchange(captureModeOfThread, mode);
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

bool FakeGpu::queryEvent(EventId id) {
  bindDevice();
  checkUnsafeCall("cudaEventQuery");
  std::unique_lock<std::recursive_mutex> lock(world_->mutex());
  checkCudaFault("cudaEventQuery");
  const Event event = events_[id];
  TORCH_CHECK(!event.captured,
              "CUDA error: operation not permitted on an event last recorded in a capturing "
              "stream (cudaErrorCapturedEvent), querying E",
              id);
  if (models().devices && event.device != currentDeviceOfThread) {
    log_.violation("cudaEventQuery(E" + std::to_string(id) + ") of " + deviceName(event.device) +
                   " on a thread whose current device is " + deviceName(currentDeviceOfThread));
  }
  if (!event.stream) {
    return true;
  }
  if (!models().progress) {
    world_->advance();  // without a thread of its own, the GPU runs when asked
  }
  return stream(*event.stream).ran >= event.position;
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

void FakeGpu::checkUnsafeCall(const char* call) {
  Lock lock(world_->mutex());
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
  Lock lock(world_->mutex());
  return capturedLocked(stream);
}

bool FakeGpu::capturedLocked(StreamId stream) const {
  return capture_ && capture_->items.count(stream) > 0;
}

// --- kernels

Buffer FakeGpu::buffer(const void* pointer, const char* role) const {
  return Buffer{pointer, role, FakeMemory::instance().lookup(pointer)};
}

void FakeGpu::push(StreamId streamId, Item item,
                   std::optional<std::pair<StreamId, uint64_t>> waitOnCaptured) {
  item.issued = ++issued_;
  if (capturedLocked(streamId)) {
    // A graph node: it runs at each replay, not now.
    capture_->captured.push_back(CapturedItem{streamId, std::move(item), waitOnCaptured});
    ++capture_->items[streamId];
    return;
  }
  Stream& target = stream(streamId);
  target.pending.push_back(std::move(item));
  ++target.enqueued;
  world_->notify();
}

void FakeGpu::launchAten(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                         c10::ArrayRef<at::Tensor> inputs, int64_t scalar) {
  if (!models().atenKernels) {
    kernel.run(outputs, inputs, scalar);  // at once, as if the CPU were the device
    return;
  }
  Item item;
  item.kind = Item::Kind::Aten;
  item.name = kernel.name;
  item.run = kernel.run;
  item.scalar = scalar;
  for (const auto& output : outputs) {
    item.outputs.push_back(TensorView::of(output));
    if (output.numel() > 0) {
      item.buffers.push_back(buffer(output.data_ptr(), "output"));
    }
  }
  for (const auto& input : inputs) {
    item.inputs.push_back(TensorView::of(input));
    if (input.numel() > 0) {
      item.buffers.push_back(buffer(input.data_ptr(), "input"));
    }
  }
  Lock lock(world_->mutex());
  push(currentStream(), std::move(item));  // where ATen would enqueue it
}

void FakeGpu::launchNccl(StreamId streamId, std::shared_ptr<NcclLaunch> launch,
                         std::vector<Buffer> buffers) {
  Lock lock(world_->mutex());
  std::string names;
  for (const NcclOp& op : launch->ops) {
    static const char* const kNames[] = {"ncclAllReduce", "ncclBroadcast",     "ncclReduce",
                                         "ncclAllGather", "ncclReduceScatter", "ncclSend",
                                         "ncclRecv"};
    names += (names.empty() ? "" : "+") + std::string(kNames[static_cast<int>(op.kind)]);
  }
  checkAlive(streamId, names);
  if (models().memory) {
    for (const Buffer& buffer : buffers) {
      if (buffer.atCall.tracked && !buffer.atCall.live) {
        log_.violation(names + " was handed a " + buffer.role + " buffer that had been freed");
      }
    }
  }
  if (!capturedLocked(streamId)) {
    world_->number(*launch);  // a captured kernel is numbered at each replay instead
  }
  Item item;
  item.kind = Item::Kind::Nccl;
  item.name = names;
  item.buffers = std::move(buffers);
  item.launch = std::move(launch);
  push(streamId, std::move(item));
}

void FakeGpu::stopLaunches(uint64_t comm, int rank) {
  Lock lock(world_->mutex());
  for (auto& [streamId, stream] : streams_) {
    for (Item& item : stream.pending) {
      if (item.kind == Item::Kind::Nccl && item.launch->comm == comm && item.launch->rank == rank &&
          !item.launch->stopped) {
        checkBuffers(streamId, item, "was stopped by ncclCommAbort");
        item.launch->stopped = true;
        item.buffers.clear();  // stopped: it touches nothing more
      }
    }
  }
  world_->notify();
}

bool FakeGpu::hasLaunches(uint64_t comm, int rank) const {
  Lock lock(world_->mutex());
  for (const auto& [streamId, stream] : streams_) {
    for (const Item& item : stream.pending) {
      if (item.kind == Item::Kind::Nccl && item.launch->comm == comm && item.launch->rank == rank &&
          !item.launch->stopped) {
        return true;
      }
    }
  }
  return false;
}

void FakeGpu::checkHeldUntilGroupEnd(const std::string& name, const std::vector<Buffer>& buffers) {
  if (!models().memory) {
    return;
  }
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
  if (!models().devices) {
    return;
  }
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
  Lock lock(world_->mutex());
  enqueueInProgress_[stream] = call;
}

void FakeGpu::clearEnqueueInProgress(StreamId stream) {
  Lock lock(world_->mutex());
  enqueueInProgress_.erase(stream);
}

void FakeGpu::poisonLater(const FakeMemory::Owner& owner, uint8_t* data, uint64_t generation) {
  if (owner.pool != 0) {
    return;  // a graph's pool: the graph writes it at each replay
  }
  Lock lock(world_->mutex());
  Item poison;
  poison.kind = Item::Kind::Poison;
  poison.name = "poison";
  poison.data = data;
  poison.generation = generation;
  poison.issued = ++issued_;
  // Not captured even on a captured stream: freeing is the allocator's, not a graph node.
  Stream& target = stream(owner.stream);
  target.pending.push_back(std::move(poison));
  ++target.enqueued;
  world_->notify();
}

// --- the engine's side

std::vector<std::pair<StreamId, const Item*>> FakeGpu::heads() const {
  std::vector<std::pair<StreamId, const Item*>> heads;
  if (held_) {
    return heads;
  }
  for (const auto& [id, stream] : streams_) {
    if (!stream.pending.empty()) {
      heads.emplace_back(id, &stream.pending.front());
    }
  }
  if (models().singleQueue && heads.size() > 1) {
    // One hardware queue: only the earliest issued may go, whatever holds it up.
    auto first = std::min_element(heads.begin(), heads.end(), [](const auto& a, const auto& b) {
      return a.second->issued < b.second->issued;
    });
    return {*first};
  }
  return heads;
}

bool FakeGpu::runHead(StreamId streamId) {
  Stream& running = stream(streamId);
  const Item& item = running.pending.front();
  FakeMemory::Untracked fakesOwn;
  switch (item.kind) {
    case Item::Kind::Wait:
      if (stream(item.waitStream).ran < item.waitPosition) {
        return false;
      }
      break;
    case Item::Kind::Poison:
      FakeMemory::instance().poisonIfStillFree(item.data, item.generation);
      break;
    case Item::Kind::Host:
      if (checkBuffers(streamId, item, "ran")) {
        item.host();
      }
      break;
    case Item::Kind::Aten:
      if (checkBuffers(streamId, item, "ran")) {
        try {
          item.run(views(item.outputs), views(item.inputs), item.scalar);
        } catch (const std::exception& e) {
          log_.violation(item.name + " on " + name(streamId) + " failed: " + e.what());
        }
      }
      break;
    case Item::Kind::Nccl: {
      const NcclLaunch& launch = *item.launch;
      if (launch.stopped) {
        break;
      }
      world_->checkNotDestroyed(*this, streamId, item);
      if (!checkBuffers(streamId, item, "ran")) {
        break;
      }
      if (models().peers && world_->simulatesPeers()) {
        // Its peers are mirrors of this member: a collective computes from n copies of its
        // buffers. (A mirror's message is not modelled: a recv keeps what it held.)
        for (const NcclOp& op : launch.ops) {
          if (op.collective()) {
            runMirroredCollective(op, launch.rank, launch.nranks);
          }
        }
      }
      break;
    }
  }
  popHead(streamId);
  return true;
}

void FakeGpu::popHead(StreamId streamId) {
  Stream& running = stream(streamId);
  const Item& item = running.pending.front();
  if (item.kind != Item::Kind::Wait && item.kind != Item::Kind::Poison) {
    ran_.push_back(name(streamId) + " " + item.name);
  }
  running.pending.pop_front();
  ++running.ran;
}

bool FakeGpu::checkBuffers(StreamId streamId, const Item& item, const char* until) {
  if (!models().memory) {
    return true;
  }
  bool intact = true;
  for (const Buffer& buffer : item.buffers) {
    if (!buffer.atCall.tracked) {
      continue;
    }
    const auto now = FakeMemory::instance().lookup(buffer.pointer);
    if (!now.tracked) {
      log_.violation(item.name + " on " + name(streamId) + " " + until + " after its " +
                     buffer.role + " buffer was freed and returned to the system");
      intact = false;
      continue;
    }
    if (item.replay != 0) {
      // The graph's pool keeps its memory for the replays. But memory the capture freed and
      // handed to a later allocation holds two tensors: every use of the earlier one must run
      // before any of the later one's, which only the graph's own order can ensure.
      uint64_t& latest = replayUses_[{item.replay, now.start}];
      if (buffer.atCall.generation < latest) {
        log_.violation("a replay of " + item.name + " on " + name(streamId) + " " + until +
                       " on its " + buffer.role +
                       " buffer after a kernel of the tensor that "
                       "the capture gave the same memory to later: it was freed too early");
      }
      latest = std::max(latest, buffer.atCall.generation);
      continue;
    }
    if (now.live && now.generation == buffer.atCall.generation) {
      continue;  // held since the call
    }
    // Memory freed and reused on the item's own stream is safe: later work there runs after
    // it. From any other stream it is not.
    // (A block of no GPU's was allocated by a thread that had not used one yet: on the
    // default stream, as a GPU would have it.)
    const bool ownStream = (buffer.atCall.owner.gpu == serial_ || buffer.atCall.owner.gpu == 0) &&
                           buffer.atCall.owner.stream == streamId;
    if (!ownStream) {
      log_.violation(item.name + " on " + name(streamId) + " " + until + " after its " +
                     buffer.role + " buffer (allocated on " + name(buffer.atCall.owner.stream) +
                     ") was freed: nothing held it until then");
    }
  }
  return intact;
}

bool FakeGpu::idle() const {
  for (const auto& [id, stream] : streams_) {
    if (!stream.pending.empty()) {
      return false;
    }
  }
  return true;
}

// --- test controls

void FakeGpu::beginCapture(cudaStreamCaptureMode mode) {
  bindDevice();
  Lock lock(world_->mutex());
  const StreamId origin = currentStream();
  log_.add("cudaStreamBeginCapture(" + name(origin) + ", " + modeName(mode) + ")");
  if (!models().capture) {
    return;
  }
  TORCH_CHECK(!capture_, "streamnccl fake: a capture is under way already");
  capture_ =
      Capture{origin, mode, std::this_thread::get_id(), "", ++poolsMade_, {{origin, 0}}, {}, {}};
  FakeMemory::setAllocationOwner(ownerFor(origin));  // from the graph's pool now
}

std::string FakeGpu::endCapture() {
  Lock lock(world_->mutex());
  log_.add("cudaStreamEndCapture(" + name(currentStream()) + ")");
  if (!models().capture) {
    return "ok";
  }
  TORCH_CHECK(capture_, "streamnccl fake: no capture is under way");
  Capture capture = std::move(*capture_);
  capture_.reset();
  FakeMemory::setAllocationOwner(ownerFor(currentStream()));
  if (!capture.invalidated.empty()) {
    return "invalidated: " + capture.invalidated;
  }
  for (const auto& [streamId, items] : capture.items) {
    if (streamId == capture.origin) {
      continue;
    }
    auto joined = capture.joinedAt.find(streamId);
    if (joined == capture.joinedAt.end() || joined->second < items) {
      return "unjoined: " + name(streamId);
    }
  }
  const int number = graphs_.empty() ? 1 : graphs_.rbegin()->first + 1;
  graphs_[number] = Graph{capture.pool, std::move(capture.captured)};
  return "ok";
}

int FakeGpu::lastGraph() const {
  Lock lock(world_->mutex());
  return graphs_.empty() ? 0 : graphs_.rbegin()->first;
}

void FakeGpu::replay(int number) {
  Lock lock(world_->mutex());
  auto graph = graphs_.find(number);
  TORCH_CHECK(graph != graphs_.end(), "streamnccl fake: no graph ", number);
  // Where each stream stands as the replay begins: a captured wait's count is from there.
  std::map<StreamId, uint64_t> base;
  for (const auto& captured : graph->second.items) {
    base.try_emplace(captured.stream, stream(captured.stream).enqueued);
    if (captured.waitOnCaptured) {
      base.try_emplace(captured.waitOnCaptured->first,
                       stream(captured.waitOnCaptured->first).enqueued);
    }
  }
  log_.add("cudaGraphLaunch(G" + std::to_string(number) + ")");
  const uint64_t replay = ++replaysMade_;
  for (const auto& captured : graph->second.items) {
    Item item = captured.item;
    item.replay = replay;
    if (captured.waitOnCaptured) {
      item.waitStream = captured.waitOnCaptured->first;
      item.waitPosition = base[item.waitStream] + captured.waitOnCaptured->second;
    }
    if (item.kind == Item::Kind::Nccl) {
      item.launch = std::make_shared<NcclLaunch>(*item.launch);
      world_->number(*item.launch);
    }
    push(captured.stream, std::move(item));
  }
}

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
    ++futuresNamingDevice_;
  }
}

int FakeGpu::futuresNamingDevice() const {
  Lock lock(world_->mutex());
  return futuresNamingDevice_;
}

}  // namespace streamnccl::fake
