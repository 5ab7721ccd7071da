#pragma once

#include "core/Device.hpp"
#include "cuda/CudaApi.hpp"

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace streamnccl {

// CUDA events for reuse: every async op records two, and creating one costs a driver call.
// An event goes back to the pool when its Event is destroyed (its Work, or the launch, is
// done with it); the pool outlives every Event that holds it.
class CudaEventPool {
 public:
  // `timing`: its events can be timed against each other (Event::millisecondsSince).
  CudaEventPool(std::shared_ptr<CudaApi> cuda, c10::Device device, bool timing);
  ~CudaEventPool();
  CudaEventPool(const CudaEventPool&) = delete;
  CudaEventPool& operator=(const CudaEventPool&) = delete;

  cudaEvent_t take();
  void give(cudaEvent_t event);
  bool timing() const { return timing_; }
  CudaApi& cuda() const { return *cuda_; }

 private:
  const std::shared_ptr<CudaApi> cuda_;
  const c10::Device device_;
  const bool timing_;
  // One free event kept outside the lock: a sync op takes one and its retirement gives it back,
  // so most launches find it here.
  std::atomic<cudaEvent_t> spare_{nullptr};
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// Work for one stream, held back until the gate opens, then issued in order by the thread that
// opens it; once open (and drained) work passes at once.
class StreamGate {
 public:
  void pass(std::function<void()> issue);
  void open();
  // Open and drained: what comes now is issued at once by its caller, for good.
  bool passesAtOnce() const { return passesAtOnce_.load(std::memory_order_acquire); }

 private:
  std::mutex mutex_;
  std::deque<std::function<void()>> waiting_;
  bool open_ = false;
  std::atomic<bool> passesAtOnce_{false};
};

// The Device of the NCCL path: the caller's current CUDA stream, one internal stream of its
// own per group and device (made on the first async op), and pooled CUDA events. Everything
// it issues, from any thread, is issued with its device current.
class CudaDevice final : public Device {
 public:
  CudaDevice(std::shared_ptr<CudaApi> cuda, c10::Device device, bool highPriority);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  c10::Device device() const override { return device_; }
  c10::Stream currentStream() override { return cuda_->currentStream(device_); }
  c10::Stream internalStream() override;
  std::unique_ptr<Event> createEvent() override;
  std::unique_ptr<Event> createTimedEvent() override;
  // Runs the task now, with this device and `stream` current, so that the NCCL calls and ATen
  // kernels it issues are enqueued on `stream` (on a gated internal stream: when it opens).
  void enqueue(c10::Stream stream, Task task) override;
  // A task only issues its op's kernels: the op starts when the stream reaches them.
  bool tasksRunInStreamOrder() const override { return false; }
  void launch(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
              c10::ArrayRef<at::Tensor> inputs, int64_t scalar) override {
    cuda_->launchKernel(kernel, outputs, inputs, scalar);
  }
  // The op's future records its events on this device's current stream when it completes
  // (inside the task: the op's stream), and a then() callback or wait() waits for them.
  std::vector<c10::Device> futureDevices() const override { return cuda_->futureDevices(device_); }
  // Completed on a stream of its own that waits for `end`: the op's stream may have run more
  // since (later ops, the user's kernels), or be captured into a graph now.
  c10::intrusive_ptr<c10::ivalue::Future> completedFuture(Event& end, const c10::TypePtr& type,
                                                          c10::IValue value) override;
  bool isCapturing(c10::Stream stream) override;

  // A lane's device: until `gate` opens (its communicator has connected), what is issued for
  // the internal stream waits in it, so the host goes on. See NcclConnection.
  void gateInternalStream(std::shared_ptr<StreamGate> gate) { gate_ = std::move(gate); }
  // Issues `issue` for `stream`: through the gate while it holds the internal stream (a
  // lane's, until it has connected), stored as a std::function for it; otherwise at once,
  // with nothing allocated for it.
  template <typename Issue>
  void issueFor(c10::Stream stream, Issue&& issue) {
    if (heldBack(stream)) {
      gate_->pass(std::function<void()>(std::forward<Issue>(issue)));
    } else {
      issue();
    }
  }
  // Whether work for `stream` may wait in the gate (once open and drained, it never does).
  bool heldBack(c10::Stream stream) const {
    return gate_ && !gate_->passesAtOnce() && internal_ && stream == *internal_;
  }

  const std::shared_ptr<CudaApi>& cuda() const { return cuda_; }

 private:
  const std::shared_ptr<CudaApi> cuda_;
  const c10::Device device_;
  const bool highPriority_;
  std::once_flag internalCreated_;
  std::optional<c10::Stream> internal_;
  std::once_flag lateFuturesCreated_;
  std::optional<c10::Stream> lateFutures_;  // where late futures are completed (completedFuture)
  const std::shared_ptr<CudaEventPool> events_;
  const std::shared_ptr<CudaEventPool> timedEvents_;
  std::shared_ptr<StreamGate> gate_;
};

}  // namespace streamnccl
