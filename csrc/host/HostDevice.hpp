#pragma once

#include "core/Device.hpp"
#include "host/HostStream.hpp"

#include <functional>
#include <memory>

namespace streamnccl {

// The Device of the host path. Its two streams, as c10::Stream values on the CPU device:
// the caller's stream is the calling thread, which is synchronous (a task enqueued there runs
// at once, after everything enqueued on the internal stream before it has posted its calls,
// and waits for its own); the internal stream is a HostStream, whose ops post their calls to
// Gloo from whichever thread finds it ready and settle once Gloo has completed them.
class HostDevice final : public Device {
 public:
  static constexpr c10::StreamId kCallerStream = 0;
  static constexpr c10::StreamId kInternalStream = 1;

  // `postsAtOnce`: whether an op's task, run now, would post its calls without waiting (the
  // ranks it exchanges with are known to have opened Gloo). One that would not runs on the
  // stream's worker, so that an async op never holds its caller.
  explicit HostDevice(std::function<bool()> postsAtOnce);

  c10::Device device() const override { return c10::Device(c10::kCPU); }
  c10::Stream currentStream() override { return stream(kCallerStream); }
  c10::Stream internalStream() override { return stream(kInternalStream); }
  std::unique_ptr<Event> createEvent() override;
  std::unique_ptr<Event> createTimedEvent() override;
  void enqueue(c10::Stream stream, Task task) override;
  void afterCalls(c10::Stream stream, Settle settle) override;
  bool joinBlocksCaller() const override { return true; }

  // The internal stream, where the communicator's calls on it are awaited.
  const std::shared_ptr<HostStream>& hostStream() const { return internal_; }

 private:
  static c10::Stream stream(c10::StreamId id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCPU), id);
  }

  const std::function<bool()> postsAtOnce_;
  const std::shared_ptr<HostStream> internal_ = std::make_shared<HostStream>();
};

}  // namespace streamnccl
