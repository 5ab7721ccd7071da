#include "cuda/CudaDevice.hpp"

#include "core/Backoff.hpp"

#include <ATen/ThreadLocalState.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>

namespace streamnccl {
namespace {

// What an Event's deferred issues share: the pooled CUDA event, back in the pool only once
// nothing can still record or wait on it.
struct EventState {
  EventState(std::shared_ptr<CudaEventPool> pool, c10::Device device)
      : cuda(&pool->cuda()), pool(std::move(pool)), device(device), event(this->pool->take()) {}
  ~EventState() { pool->give(event); }

  // `failed`: the record itself failed, so there is nothing to wait for. Waiters are woken
  // only when there are some, and the lock is taken only then: most records (the group's own
  // streams) are issued at once and never waited for, and this runs on every op's launch path.
  // No wake-up is lost: a waiter counts itself before it reads `recorded` (both sequentially
  // consistent), so either it sees the record or this sees the waiter, and then notifies under
  // the lock the waiter holds until it sleeps.
  void markRecorded(bool failed) {
    recordFailed = failed;
    recorded.store(true);
    if (waiters.load() > 0) {
      { std::lock_guard<std::mutex> lock(mutex); }
      changed.notify_all();
    }
  }
  bool waitRecorded(std::chrono::milliseconds timeout) {
    if (isRecorded()) {
      return true;
    }
    std::unique_lock<std::mutex> lock(mutex);
    ++waiters;
    const bool done = changed.wait_for(lock, timeout, [&] { return recorded.load(); });
    --waiters;
    return done;
  }
  // False when the record failed.
  bool waitUntilRecorded() {
    if (!isRecorded()) {
      std::unique_lock<std::mutex> lock(mutex);
      ++waiters;
      changed.wait(lock, [&] { return recorded.load(); });
      --waiters;
    }
    return !recordFailed;  // written before `recorded`, which this thread has seen set
  }
  bool isRecorded() const { return recorded.load(std::memory_order_acquire); }

  CudaApi* const cuda;  // the pool's, which it keeps alive
  const std::shared_ptr<CudaEventPool> pool;
  const c10::Device device;
  const cudaEvent_t event;
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<int> waiters{0};        // threads waiting on `changed`; changed under `mutex`
  std::atomic<bool> recorded{false};  // issued: its record on a gated stream may come later
  bool recordFailed = false;          // set before `recorded`, read after it
};

// Queries in thread-local capture mode: a query from a thread that is not capturing must not
// invalidate another thread's global-mode capture (the watchdog queries while users capture).
class CaptureModeScope {
 public:
  explicit CaptureModeScope(CudaApi& cuda)
      : cuda_(cuda), previous_(cuda.exchangeCaptureMode(cudaStreamCaptureModeThreadLocal)) {}
  // Never throws (a destructor): after a sticky CUDA error restoring fails too, and the
  // error that matters is the one the scope's call raised.
  ~CaptureModeScope() {
    try {
      cuda_.exchangeCaptureMode(previous_);
    } catch (const std::exception& e) {
      LOG(WARNING) << "streamnccl: restoring the thread's capture mode failed: " << e.what();
    }
  }
  CaptureModeScope(const CaptureModeScope&) = delete;
  CaptureModeScope& operator=(const CaptureModeScope&) = delete;

 private:
  CudaApi& cuda_;
  const cudaStreamCaptureMode previous_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(CudaDevice& device, std::shared_ptr<CudaEventPool> pool)
      : device_(device), state_(std::make_shared<EventState>(std::move(pool), device.device())) {}

  void record(c10::Stream stream) override {
    // Only a record held back for later shares the state: one issued now needs no reference
    // of its own (every op's launch records one or two).
    if (!device_.heldBack(stream)) {
      recordNow(*state_, stream);
      return;
    }
    device_.issueFor(stream, [state = state_, stream] { recordNow(*state, stream); });
  }

  void block(c10::Stream stream) override {
    if (!device_.heldBack(stream)) {
      blockNow(*state_, stream);
      return;
    }
    device_.issueFor(stream, [state = state_, stream] { blockNow(*state, stream); });
  }

  bool query() override {
    if (!state_->isRecorded()) {
      return false;
    }
    auto onDevice = state_->cuda->useDevice(state_->device);  // no context on device 0
    CaptureModeScope threadLocal(*state_->cuda);
    // Unanswered (a capture forbids looking now) is not yet passed: the op stays in flight.
    return state_->cuda->queryEvent(state_->event) == CudaApi::EventStatus::Passed;
  }

  std::optional<double> millisecondsSince(Event& start) override {
    auto* from = dynamic_cast<CudaEvent*>(&start);
    if (!from || !state_->pool->timing() || !from->state_->pool->timing() || !from->query() ||
        !query()) {
      return std::nullopt;
    }
    auto onDevice = state_->cuda->useDevice(state_->device);
    CaptureModeScope threadLocal(*state_->cuda);
    return state_->cuda->elapsedMs(from->state_->event, state_->event);
  }

  static void recordNow(EventState& state, c10::Stream stream) {
    try {
      auto onDevice = state.cuda->useDevice(state.device);
      state.cuda->recordEvent(state.event, stream);
    } catch (...) {
      state.markRecorded(/*failed=*/true);  // no waiter is left waiting for it
      throw;
    }
    state.markRecorded(/*failed=*/false);
  }

  static void blockNow(EventState& state, c10::Stream stream) {
    // A stream outside the gate waits on the host until the event's record is issued (a
    // gated lane issues it once its communicator has connected, or failed to).
    if (!state.waitUntilRecorded()) {
      return;
    }
    auto onDevice = state.cuda->useDevice(state.device);
    state.cuda->streamWaitEvent(stream, state.event);
  }

  bool synchronize(std::chrono::milliseconds timeout) override {
    // Polled rather than cudaEventSynchronize, which cannot time out.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (!state_->waitRecorded(timeout)) {
      return false;
    }
    Backoff backoff(std::chrono::microseconds(20), std::chrono::microseconds(1000));
    while (!query()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      backoff.pause();
    }
    return true;
  }

 private:
  CudaDevice& device_;
  const std::shared_ptr<EventState> state_;
};

// Makes a stream current for a scope, as c10's CUDAStreamGuard, through the CudaApi.
class CurrentStreamGuard {
 public:
  CurrentStreamGuard(CudaApi& cuda, c10::Stream stream)
      : cuda_(cuda), previous_(cuda.exchangeCurrentStream(stream)) {}
  ~CurrentStreamGuard() { cuda_.exchangeCurrentStream(previous_); }
  CurrentStreamGuard(const CurrentStreamGuard&) = delete;
  CurrentStreamGuard& operator=(const CurrentStreamGuard&) = delete;

 private:
  CudaApi& cuda_;
  const c10::Stream previous_;
};

// Runs an op's task as every task runs, issued now or held back until a lane connects: with
// the group's device and the op's stream current.
template <typename Task>
void runOnStream(CudaApi& cuda, c10::Device device, c10::Stream stream, Task& task) {
  auto onDevice = cuda.useDevice(device);
  CurrentStreamGuard guard(cuda, stream);
  task();
}

}  // namespace

void StreamGate::pass(std::function<void()> issue) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_ || !waiting_.empty()) {
      waiting_.push_back(std::move(issue));
      return;
    }
  }
  issue();
}

void StreamGate::open() {
  while (true) {
    std::function<void()> issue;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (waiting_.empty()) {
        open_ = true;
        passesAtOnce_.store(true, std::memory_order_release);
        return;
      }
      issue = std::move(waiting_.front());
      waiting_.pop_front();
    }
    try {
      issue();
    } catch (const std::exception& e) {  // what follows it on the stream must still be issued
      LOG(ERROR) << "streamnccl: work held for a lane failed as it was issued: " << e.what();
    }
  }
}

CudaEventPool::CudaEventPool(std::shared_ptr<CudaApi> cuda, c10::Device device, bool timing)
    : cuda_(std::move(cuda)), device_(device), timing_(timing) {}

CudaEventPool::~CudaEventPool() {
  try {  // a destructor: after a sticky CUDA error the events go with the context
    auto onDevice = cuda_->useDevice(device_);
    if (cudaEvent_t event = spare_.load()) {
      cuda_->destroyEvent(event);
    }
    for (cudaEvent_t event : free_) {
      cuda_->destroyEvent(event);
    }
  } catch (const std::exception& e) {
    LOG(WARNING) << "streamnccl: destroying the events of " << device_ << " failed: " << e.what();
  }
}

cudaEvent_t CudaEventPool::take() {
  if (cudaEvent_t event = spare_.exchange(nullptr, std::memory_order_acquire)) {
    return event;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t event = free_.back();
      free_.pop_back();
      return event;
    }
  }
  auto onDevice = cuda_->useDevice(device_);
  return cuda_->createEvent(timing_);
}

// An event may go back still pending: a stream that waits on it has already captured that
// record (cudaStreamWaitEvent binds to the latest record at the time of the call), so the
// next record on it changes nothing for that stream.
void CudaEventPool::give(cudaEvent_t event) {
  cudaEvent_t none = nullptr;
  if (spare_.compare_exchange_strong(none, event, std::memory_order_release,
                                     std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(event);
}

CudaDevice::CudaDevice(std::shared_ptr<CudaApi> cuda, c10::Device device, bool highPriority)
    : cuda_(std::move(cuda)),
      device_(device),
      highPriority_(highPriority),
      events_(std::make_shared<CudaEventPool>(cuda_, device, /*timing=*/false)),
      timedEvents_(std::make_shared<CudaEventPool>(cuda_, device, /*timing=*/true)) {}

CudaDevice::~CudaDevice() {
  if (lateFutures_) {  // never gated: what waits on it was issued at once
    try {
      auto onDevice = cuda_->useDevice(device_);
      cuda_->destroyStream(*lateFutures_);
    } catch (const std::exception& e) {
      LOG(WARNING) << "streamnccl: destroying a stream of " << device_ << " failed: " << e.what();
    }
  }
  if (!internal_) {
    return;
  }
  // The runtime frees the stream once the work queued on it has run; a lane's gate may still
  // hold work for it, so the stream goes after that work.
  // Never throws (a destructor): after a sticky CUDA error every call fails, and the stream
  // goes with the context.
  auto destroy = [cuda = cuda_, device = device_, stream = *internal_] {
    try {
      auto onDevice = cuda->useDevice(device);
      cuda->destroyStream(stream);
    } catch (const std::exception& e) {
      LOG(WARNING) << "streamnccl: destroying an internal stream of " << device
                   << " failed: " << e.what();
    }
  };
  if (gate_) {
    gate_->pass(std::move(destroy));
  } else {
    destroy();
  }
}

c10::Stream CudaDevice::internalStream() {
  std::call_once(internalCreated_, [&] {
    auto onDevice = cuda_->useDevice(device_);
    internal_ = cuda_->createStream(highPriority_);
  });
  return *internal_;
}

std::unique_ptr<Event> CudaDevice::createEvent() {
  return std::make_unique<CudaEvent>(*this, events_);
}

std::unique_ptr<Event> CudaDevice::createTimedEvent() {
  return std::make_unique<CudaEvent>(*this, timedEvents_);
}

void CudaDevice::enqueue(c10::Stream stream, Task task) {
  if (!heldBack(stream)) {
    runOnStream(*cuda_, device_, stream, task);
    return;
  }
  // It runs later, on the connecting thread: with the caller's grad mode, inference mode,
  // dispatch exclusions and the like, as it would have run here.
  gate_->pass([cuda = cuda_, device = device_, stream, state = at::ThreadLocalState(),
               task = std::move(task).take()] {
    at::ThreadLocalStateGuard callersState(state);
    runOnStream(*cuda, device, stream, task);
  });
}

c10::intrusive_ptr<c10::ivalue::Future> CudaDevice::completedFuture(Event& end,
                                                                    const c10::TypePtr& type,
                                                                    c10::IValue value) {
  std::call_once(lateFuturesCreated_, [&] {
    auto onDevice = cuda_->useDevice(device_);
    lateFutures_ = cuda_->createStream(/*highPriority=*/false);
  });
  end.block(*lateFutures_);
  auto onDevice = cuda_->useDevice(device_);
  CurrentStreamGuard guard(*cuda_, *lateFutures_);
  auto future = c10::make_intrusive<c10::ivalue::Future>(type, cuda_->futureDevices(device_));
  future->markCompleted(std::move(value));  // c10 records the future's events on it
  return future;
}

bool CudaDevice::isCapturing(c10::Stream stream) {
  auto onDevice = cuda_->useDevice(device_);
  return cuda_->isCapturing(stream);
}

}  // namespace streamnccl
