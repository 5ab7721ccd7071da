#pragma once

// Turning the tensors users pass into the buffers the Communicator takes. The buffer helpers
// run inside an op's enqueued task, and issue their ATen work through the op's Kernels, so
// every copy they make is ordered on the op's stream.

#include "core/Communicator.hpp"
#include "core/Kernels.hpp"
#include "core/TensorList.hpp"

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <c10/util/MaybeOwned.h>

#include <array>
#include <memory>
#include <optional>
#include <vector>

namespace streamnccl::lowering {

// How a c10d reduce op runs on a communicator.
struct Reduction {
  ReduceKind kind = ReduceKind::Sum;      // what the communicator is asked for
  at::Tensor factor;                      // with kind PreMulSum: the communicator's factor
  bool factorOnHost = true;               // a scalar's, on the CPU; else on the device
  bool divideBySize = false;              // AVG as SUM, then a division
  std::optional<at::Tensor> premultiply;  // PREMUL_SUM as a product, then SUM

  ReduceOp communicatorOp() const { return {kind, factor, factorOnHost}; }
  // `tensors` and the factors a kernel of the op reads when it runs: an async op's Work holds
  // them until its end event (a factor converted at the call is a tensor of its own).
  // Without factors, `tensors` itself, borrowed (see TensorList).
  TensorList withFactors(const std::vector<at::Tensor>& tensors) const;
};

// The temporaries an op's issue step makes for the communicator (contiguous copies, gathered
// or concatenated buffers), kept by the op's steps (Steps::over, Launch.hpp) until its task
// ends: inside a group NCCL reads them only at ncclGroupEnd, and a temporary freed before
// would be handed by the caching allocator to the next allocation on the same stream, whose
// kernels run first. One (an at::Tensor), two, or as many as the op needs.
using Pair = std::array<at::Tensor, 2>;
using Many = std::vector<at::Tensor>;

// Validates `reduceOp` for `dtype` on `communicator` (raising at the call, naming `op`) and
// lowers it: AVG to SUM and a division where the communicator cannot average; PREMUL_SUM to
// a product and SUM where it has no PreMulSum (or the dtype is complex); bool SUM/PRODUCT to
// MAX/MIN (logical or/and); complex only for ops that act on real and imaginary parts alone.
// A factor of another dtype is converted at the call, on the caller's stream (`kernels`).
Reduction reduction(const char* op, const c10d::ReduceOp& reduceOp, const at::Tensor& tensor,
                    const Transport& communicator, Kernels& kernels);

// The buffer a reduction works on: complex as its real view, bool as bytes; any other tensor
// is itself, borrowed (no reference count on every op's path), so the result may not outlive
// `contiguousTensor`.
c10::MaybeOwned<at::Tensor> reductionBuffer(const at::Tensor& contiguousTensor);

// The buffer an op that only moves data hands its communicator: the bytes of the tensor, so
// every dtype (bool, float8, complex, ...) moves on every path; the tensor itself when it is
// already flat bytes. Made below autograd, which would cost more than the rest of a small
// op's lowering, so writes through it need not bump the tensor's version counter (a
// communicator's are not the caller's to see). A kernel writing through bytes uses
// kernelBytes().
at::Tensor bytes(const at::Tensor& contiguousTensor);
// bytes() as a view autograd tracks: a kernel's write through it bumps the tensor's version
// counter, which the in-flight write check credits to the op (InflightWrites.hpp).
at::Tensor kernelBytes(const at::Tensor& contiguousTensor);

// `dense` scaled for PREMUL_SUM, as a new tensor (the caller's input is never modified).
at::Tensor premultiplied(Kernels& kernels, at::Tensor dense, const Reduction& reduction);

// The division of AVG-by-SUM, in place on a result buffer.
void finishReduction(Kernels& kernels, const at::Tensor& result, const Reduction& reduction,
                     int size);

// The tensor a communicator receives `output` into: `output` itself when contiguous, else a
// contiguous copy; with `apart` (the output lies over memory the op still reads) a new tensor.
// Either way copyBack() then writes it into `output` if it is not `output`.
at::Tensor receiveBuffer(Kernels& kernels, const at::Tensor& output, bool apart);

// Writes `computed` back into `target` when the op had to compute in a copy.
void copyBack(Kernels& kernels, const at::Tensor& target, const at::Tensor& computed);

}  // namespace streamnccl::lowering
