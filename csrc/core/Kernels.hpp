#pragma once

// The ATen work of an op besides its communicator calls: contiguous copies, copy-backs, AVG's
// division, PREMUL_SUM's product, concatenations, the barrier's token. Each is one kernel
// issued through the op's Device on the calling thread's current stream (inside an op's task,
// the op's stream), where ATen itself would issue it. The host path and CUDA run it at once
// (on CUDA that enqueues it); the fake GPU (csrc/fake/) makes it a stream item whose buffers
// it checks, so that these kernels are ordered and lifetime-checked like the NCCL kernels
// around them. Allocations are ATen's own, made at the call: on CUDA the caching allocator
// ties them to the current stream.

#include "core/Device.hpp"

#include <ATen/core/Tensor.h>

#include <vector>

namespace streamnccl {

class InflightWrites;

class Kernels {
 public:
  explicit Kernels(Device& device) : device_(device) {}

  // For an async op's own kernels where in-flight writes are checked (InflightWrites.hpp): what
  // each kernel bumps is credited to the group, set before the first kernel.
  void creditWritesTo(InflightWrites* group) { ownWrites_ = group; }

  // `tensor` itself when it is contiguous, else a contiguous copy of it.
  at::Tensor contiguous(const at::Tensor& tensor);
  // target.copy_(source), shapes as given.
  void copy(const at::Tensor& target, const at::Tensor& source);
  // `tensor` converted to `dtype` (a new tensor, or `tensor` itself when it has that dtype).
  at::Tensor convert(const at::Tensor& tensor, at::ScalarType dtype);
  // tensor * factor, as a new tensor (`factor` a 0-dim tensor).
  at::Tensor multiply(const at::Tensor& tensor, const at::Tensor& factor);
  // tensor /= divisor, in place.
  void divide(const at::Tensor& tensor, int64_t divisor);
  // The parts (contiguous) laid end to end in one new flat tensor.
  at::Tensor concatenate(const std::vector<at::Tensor>& parts);
  // A new tensor of zeros.
  at::Tensor zeros(at::IntArrayRef sizes, const at::TensorOptions& options);

 private:
  void launch(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
              c10::ArrayRef<at::Tensor> inputs, int64_t scalar);

  Device& device_;
  InflightWrites* ownWrites_ = nullptr;
};

}  // namespace streamnccl
