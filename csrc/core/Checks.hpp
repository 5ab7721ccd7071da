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

// The one list of a list op (`outputs` of allgather and gather, `inputs` of scatter and
// reduce_scatter): `size` tensors, each on `reference`'s device and dtype with as many
// elements.
const std::vector<at::Tensor>& rankList(const char* op, const char* arg,
                                        const std::vector<std::vector<at::Tensor>>& lists,
                                        const at::Tensor& reference, int size);

// A per-rank list given as a flat vector (alltoall): `size` tensors of `reference`'s device
// and dtype.
void perRankTensors(const char* op, const char* arg, const std::vector<at::Tensor>& tensors,
                    const at::Tensor& reference, int size);

// `whole` holds exactly `size` times the elements of `part` (the tensor forms of allgather and
// reduce_scatter).
void wholeIsSizeParts(const char* op, const char* wholeArg, const at::Tensor& whole,
                      const char* partArg, const at::Tensor& part, int size);

// The split sizes of alltoall_base, filled in for an even split when empty; each rank's part
// is a block of rows (dim 0) of `tensor`.
std::vector<int64_t> splitSizes(const char* op, const char* arg, const std::vector<int64_t>& splits,
                                const at::Tensor& tensor, int size);

// The input and output lists of a coalesced op: as many of each, at least one.
void pairedLists(const char* op, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& outputs);

// The lists of allgather_coalesced: `inputs` not empty, and `outputs` one list per rank, each
// with one tensor per input, of that input's device, dtype and number of elements.
void rankMajorLists(const char* op, const char* outputsArg,
                    const std::vector<std::vector<at::Tensor>>& outputs, const char* inputsArg,
                    const std::vector<at::Tensor>& inputs, int size);

// A peer rank of a point-to-point op.
void peerInRange(const char* op, const char* arg, int64_t peer, int size);

}  // namespace streamnccl::checks
