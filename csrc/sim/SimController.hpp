#pragma once

// Test-only. What a test holds of a simulated device: it makes process groups on it and
// enqueues the test's own reads and writes on the caller's stream, as a CUDA program launches
// kernels on its current stream around its collectives.

#include "core/ProcessGroup.hpp"
#include "host/Signal.hpp"
#include "sim/SimDevice.hpp"
#include "sim/SimMemory.hpp"

namespace streamnccl::sim {

// A copy of a tensor taken on the caller's stream, available once that point has run.
class SimRead {
 public:
  SimRead() : signal_(std::make_shared<Signal>()), copy_(std::make_shared<at::Tensor>()) {}
  // Blocks until the copy is taken; raises on timeout.
  at::Tensor value(std::chrono::milliseconds timeout) const;

 private:
  friend class SimController;
  std::shared_ptr<Signal> signal_;
  std::shared_ptr<at::Tensor> copy_;
};

class SimController : public c10::intrusive_ptr_target {
 public:
  explicit SimController(SimSettings settings);

  c10::intrusive_ptr<ProcessGroup> processGroup(int rank, int size,
                                                std::chrono::milliseconds timeout,
                                                c10::intrusive_ptr<c10d::Backend> gloo);
  void write(const at::Tensor& destination, const at::Tensor& value);
  SimRead read(const at::Tensor& source);
  // Blocks the host until the caller's stream has run everything enqueued on it.
  void synchronize();
  void reseed(uint64_t seed) { streams_->reseed(seed); }
  void holdInternalStreams(bool held) { streams_->holdInternalStreams(held); }
  SimMemory& memory() { return memory_; }

 private:
  const SimSettings settings_;
  const std::shared_ptr<SimStreams> streams_;
  SimMemory memory_;
};

}  // namespace streamnccl::sim
