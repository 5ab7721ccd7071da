#pragma once

// Turning the tensors users pass into the buffers the Communicator takes. These helpers run
// inside an op's enqueued task, so every copy they make is ordered on the op's stream.

#include "core/Communicator.hpp"

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace streamnccl::lowering {

// The ReduceKind for a c10d reduce op on `dtype`, or an error naming `op` for combinations no
// path supports (PREMUL_SUM is not supported yet; complex only for ops that act elementwise
// on real and imaginary parts).
ReduceKind reduceKind(const char* op, const c10d::ReduceOp& reduceOp, at::ScalarType dtype);

// Whether AVG must be lowered to SUM and a division: the communicator cannot average `dtype`.
// Integer AVG is refused, as its result would not be an integer mean.
bool averageBySum(const char* op, const Communicator& communicator, at::ScalarType dtype);

// `tensor` itself when it is contiguous, else a contiguous copy to compute in.
at::Tensor contiguous(const at::Tensor& tensor);

// The buffer a communicator sees: complex tensors as their real view (twice the elements).
at::Tensor asBuffer(const at::Tensor& contiguousTensor);

// Writes `computed` back into `target` when the op had to compute in a copy.
void copyBack(const at::Tensor& target, const at::Tensor& computed);

}  // namespace streamnccl::lowering
