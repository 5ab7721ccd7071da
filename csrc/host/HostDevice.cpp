#include "host/HostDevice.hpp"

#include "host/Signal.hpp"

#include <c10/util/Exception.h>

namespace streamnccl {
namespace {

class HostEvent final : public Event {
 public:
  explicit HostEvent(HostDevice& device) : device_(device) {}

  void record(c10::Stream stream) override {
    signal_ = std::make_shared<Signal>();
    if (stream.id() == HostDevice::kCallerStream) {
      signal_->set();  // the caller is synchronous: what it enqueued has run
    } else {
      device_.hostStream()->enqueue([signal = signal_] { signal->set(); },
                                    HostStream::Kind::Quick);
    }
  }

  void block(c10::Stream stream) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl: host event blocked on before being recorded");
    if (stream.id() == HostDevice::kCallerStream) {
      signal_->wait();
    } else if (!query()) {  // an already-passed point needs no item on the stream
      device_.hostStream()->enqueueWaitFor(signal_);
    }
  }

  bool query() override { return signal_ && signal_->waitFor(std::chrono::milliseconds(0)); }

  bool synchronize(std::chrono::milliseconds timeout) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl: host event synchronized before being recorded");
    return signal_->waitFor(timeout);
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
  HostDevice& device_;
  std::shared_ptr<Signal> signal_;
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
  internal_->enqueue(std::move(task).take(),
                     postsAtOnce_() ? HostStream::Kind::Quick : HostStream::Kind::MayWait);
}

void HostDevice::afterCalls(c10::Stream stream, Settle settle) {
  if (stream.id() == kCallerStream) {
    settle(nullptr);  // its calls were waited for: a failure was raised to the task
    return;
  }
  internal_->afterCalls(std::move(settle).take());
}

}  // namespace streamnccl
