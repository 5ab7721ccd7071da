#include "fake/RecordingCuda.hpp"

namespace streamnccl::fake {
namespace {

class FakeDeviceScope final : public DeviceScope {
 public:
  FakeDeviceScope(std::shared_ptr<FakeGpu> gpu, int device)
      : gpu_(std::move(gpu)), previous_(FakeGpu::currentDevice()) {
    gpu_->setCurrentDevice(device);
  }
  // As c10's guard: a thread that had no device gets none back, and no context. Restoring
  // never fails, even after a sticky error (c10's guard only warns).
  ~FakeDeviceScope() override { gpu_->restoreCurrentDevice(previous_); }

 private:
  const std::shared_ptr<FakeGpu> gpu_;
  const int previous_;
};

}  // namespace

std::unique_ptr<DeviceScope> RecordingCuda::useDevice(const c10::Device& device) {
  return std::make_unique<FakeDeviceScope>(gpu_, gpu_->indexOf(device));
}

c10::Stream RecordingCuda::currentStream(const c10::Device& device) {
  return c10::Stream(c10::Stream::UNSAFE, device, gpu_->currentStream());
}

c10::Stream RecordingCuda::exchangeCurrentStream(c10::Stream stream) {
  const StreamId previous = gpu_->exchangeCurrentStream(stream.id());
  return c10::Stream(c10::Stream::UNSAFE, stream.device(), previous);
}

c10::Stream RecordingCuda::createStream(bool highPriority) {
  return c10::Stream(c10::Stream::UNSAFE, tensorsDevice_, gpu_->createStream(highPriority));
}

}  // namespace streamnccl::fake
