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
      device_.enqueue(stream, [signal = signal_] { signal->set(); });
    }
  }

  void block(c10::Stream stream) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl: host event blocked on before being recorded");
    if (stream.id() == HostDevice::kCallerStream) {
      signal_->wait();
    } else if (!query()) {  // an already-passed point needs no task on the worker
      device_.enqueue(stream, [signal = signal_] { signal->wait(); });
    }
  }

  bool query() override { return signal_ && signal_->waitFor(std::chrono::milliseconds(0)); }

  bool synchronize(std::chrono::milliseconds timeout) override {
    TORCH_INTERNAL_ASSERT(signal_, "streamnccl: host event synchronized before being recorded");
    return signal_->waitFor(timeout);
  }

  // Wall time on the worker between the two points: every host event keeps its time.
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

void HostDevice::enqueue(c10::Stream stream, Task task) {
  if (stream.id() == kCallerStream) {
    // Runs in order with the worker's tasks, so host ops keep program order, and returns when
    // done: a sync host op's result is ready when the call returns.
    worker_.runInOrder(task);
  } else {
    worker_.enqueue(std::move(task).take());
  }
}

}  // namespace streamnccl
