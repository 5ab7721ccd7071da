#include "host/HostDevice.hpp"

#include "host/Signal.hpp"

#include <c10/util/Exception.h>

namespace streamnccl {
namespace {

class HostEvent final : public Event {
 public:
  explicit HostEvent(HostDevice& device) : device_(device) {}

  void record(c10::Stream stream) override {
    onStream_ = stream.id() != HostDevice::kCallerStream;
    if (!onStream_) {
      signal_ = Signal::alreadySet();  // the caller is synchronous: what it enqueued has run
      return;
    }
    signal_ = std::make_shared<Signal>();
    device_.hostStream()->enqueue([signal = signal_] { signal->set(); }, HostStream::Kind::Quick);
  }

  void block(c10::Stream stream) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl: host event blocked on before being recorded");
    if (stream.id() == HostDevice::kCallerStream) {
      signal_->wait();
    } else if (!passed()) {  // an already-passed point needs no item on the stream
      device_.hostStream()->enqueueWaitFor(signal_);
    }
  }

  // Polled by the watchdog and is_completed(): a send or a receive that no wait() has come
  // for is handed to the stream's worker after a while, so it completes all the same.
  bool query() override {
    if (passed()) {
      return true;
    }
    if (onStream_) {
      device_.hostStream()->nudge(kUnwatchedGrace);
    }
    return false;
  }

  bool synchronize(std::chrono::milliseconds timeout) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl: host event synchronized before being recorded");
    if (onStream_ && !passed()) {
      device_.hostStream()->nudge(std::chrono::milliseconds(0));  // this waiter only sleeps
    }
    return signal_->waitFor(timeout);
  }

  // Completes the stream's calls on this thread, oldest first, until the point has passed or
  // about `slice` has gone by waiting for one.
  bool waitHelping(std::chrono::milliseconds slice) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl: host event waited for before being recorded");
    if (!onStream_) {
      return signal_->waitFor(slice);
    }
    while (true) {
      switch (device_.hostStream()->helpWait(*signal_, slice)) {
        case HostStream::Helped::Passed:
          return true;
        case HostStream::Helped::Completed:
          continue;
        case HostStream::Helped::StillWaiting:
          return passed();
      }
    }
  }

  // Wall time between the two points passing: every host event keeps its time.
  std::optional<double> millisecondsSince(Event& start) override {
    auto* from = dynamic_cast<HostEvent*>(&start);
    TORCH_INTERNAL_ASSERT(from, "streamnccl: a host event is timed against another kind");
    if (!signal_ || !from->signal_) {
      return std::nullopt;
    }
    const auto to = signal_->doneTime();
    const auto began = from->signal_->doneTime();
    if (!to || !began) {
      return std::nullopt;
    }
    return std::chrono::duration<double, std::milli>(*to - *began).count();
  }

 private:
  bool passed() const { return signal_ && signal_->waitFor(std::chrono::milliseconds(0)); }

  // How long a send or a receive waits for a wait() before the worker waits for it instead.
  static constexpr auto kUnwatchedGrace = std::chrono::milliseconds(20);

  HostDevice& device_;
  std::shared_ptr<Signal> signal_;
  bool onStream_ = false;  // recorded on the internal stream (else on the caller's, passed)
};

}  // namespace

std::unique_ptr<Event> HostDevice::createEvent() { return std::make_unique<HostEvent>(*this); }

std::unique_ptr<Event> HostDevice::createTimedEvent() { return createEvent(); }

HostDevice::HostDevice(std::function<bool()> postsAtOnce) : postsAtOnce_(std::move(postsAtOnce)) {}

void HostDevice::enqueue(c10::Stream stream, Task task) {
  if (stream.id() == kCallerStream) {
    // After what the internal stream was given before, so host ops post in program order, and
    // returns when done: a sync host op's result is ready when the call returns.
    internal_->runInOrder(task);
    return;
  }
  internal_->enqueueOp(std::move(task),
                       postsAtOnce_() ? HostStream::Kind::Quick : HostStream::Kind::MayWait);
}

void HostDevice::afterCalls(c10::Stream stream, Settle settle) {
  if (stream.id() == kCallerStream) {
    settle(nullptr);  // its calls were waited for: a failure was raised to the task
    return;
  }
  internal_->afterCalls(std::move(settle));
}

}  // namespace streamnccl
