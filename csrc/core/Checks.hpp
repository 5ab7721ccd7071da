#pragma once

// Argument checks shared by every op. Each raises at the call (ValueError or TypeError in
// Python) with a message naming the op, the argument and what was expected, before anything
// is enqueued, so a rejected call leaves the group as it was.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace streamnccl::checks {

// The one tensor of a single-tensor op (multi-tensor-per-process lists are not supported).
const at::Tensor& singleTensor(const char* op, const char* arg,
                               const std::vector<at::Tensor>& tensors);

// Strided (not sparse, not mkldnn) and defined.
void dense(const char* op, const char* arg, const at::Tensor& tensor);

void rootInRange(const char* op, const char* arg, int64_t root, int size);

// `tensor` is on the same device and of the same dtype as `reference` (the op's input).
void sameDeviceAndDtype(const char* op, const char* arg, const at::Tensor& reference,
                        const at::Tensor& tensor);

// A list allgather output: one list of `size` tensors, each as many elements as `input`.
const std::vector<at::Tensor>& allGatherOutputs(const char* op,
                                                const std::vector<std::vector<at::Tensor>>& outputs,
                                                const at::Tensor& input, int size);

}  // namespace streamnccl::checks
