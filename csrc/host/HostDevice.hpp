#pragma once

#include "core/Device.hpp"
#include "host/HostWorker.hpp"

namespace streamnccl {

// The Device of the host path. Its two streams, as c10::Stream values on the CPU device:
// the caller's stream is the calling thread, which is synchronous (work it enqueues runs
// before the call returns, in order with the worker's); the internal stream is a HostWorker.
class HostDevice final : public Device {
 public:
  static constexpr c10::StreamId kCallerStream = 0;
  static constexpr c10::StreamId kWorkerStream = 1;

  c10::Device device() const override { return c10::Device(c10::kCPU); }
  c10::Stream currentStream() override { return stream(kCallerStream); }
  c10::Stream internalStream() override { return stream(kWorkerStream); }
  std::unique_ptr<Event> createEvent() override;
  std::unique_ptr<Event> createTimedEvent() override;
  void enqueue(c10::Stream stream, Task task) override;
  bool joinBlocksCaller() const override { return true; }

 private:
  static c10::Stream stream(c10::StreamId id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCPU), id);
  }

  HostWorker worker_;
};

}  // namespace streamnccl
