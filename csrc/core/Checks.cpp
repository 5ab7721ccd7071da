#include "core/Checks.hpp"

#include "core/Errors.hpp"

#include <c10/util/irange.h>

#include <string>

namespace streamnccl::checks {

const at::Tensor& singleTensor(const char* op, const char* arg,
                               const std::vector<at::Tensor>& tensors) {
  STREAMNCCL_CHECK_ARG(tensors.size() == 1, op, "expected exactly one tensor in `", arg, "`, got ",
                       tensors.size(),
                       " (one tensor per process; multi-device lists are not supported)");
  dense(op, arg, tensors[0]);
  return tensors[0];
}

void dense(const char* op, const char* arg, const at::Tensor& tensor) {
  STREAMNCCL_CHECK_ARG(tensor.defined(), op, "`", arg, "` is an undefined tensor");
  STREAMNCCL_CHECK_ARG(tensor.layout() == c10::kStrided, op, "`", arg,
                       "` must be a dense (strided) tensor, got layout ", tensor.layout());
}

void rootInRange(const char* op, const char* arg, int64_t root, int size) {
  STREAMNCCL_CHECK_ARG(root >= 0 && root < size, op, "`", arg, "` is ", root,
                       ", expected a rank in [0, ", size, ")");
}

void sameDeviceAndDtype(const char* op, const char* arg, const at::Tensor& reference,
                        const at::Tensor& tensor) {
  dense(op, arg, tensor);
  STREAMNCCL_CHECK_ARG(tensor.device() == reference.device(), op, "`", arg, "` is on ",
                       tensor.device(), " but the input is on ", reference.device(),
                       "; all tensors of one call must be on one device");
  STREAMNCCL_CHECK_TYPE(tensor.scalar_type() == reference.scalar_type(), op, "`", arg,
                        "` has dtype ", tensor.scalar_type(), " but the input has dtype ",
                        reference.scalar_type(), "; they must match");
}

const std::vector<at::Tensor>& rankList(const char* op, const char* arg,
                                        const std::vector<std::vector<at::Tensor>>& lists,
                                        const at::Tensor& reference, int size) {
  STREAMNCCL_CHECK_ARG(lists.size() == 1, op, "expected one list in `", arg,
                       "` (one tensor per process), got ", lists.size());
  perRankTensors(op, arg, lists[0], reference, size);
  for (const auto i : c10::irange(lists[0].size())) {
    const at::Tensor& tensor = lists[0][i];
    STREAMNCCL_CHECK_ARG(tensor.numel() == reference.numel(), op, "`", arg, "[", i, "]` has ",
                         tensor.numel(), " elements (shape ", tensor.sizes(),
                         "), expected as many as the single tensor: ", reference.numel(),
                         " (shape ", reference.sizes(), ")");
  }
  return lists[0];
}

void perRankTensors(const char* op, const char* arg, const std::vector<at::Tensor>& tensors,
                    const at::Tensor& reference, int size) {
  STREAMNCCL_CHECK_ARG(static_cast<int>(tensors.size()) == size, op, "`", arg, "` has ",
                       tensors.size(), " tensors, expected one per rank: ", size);
  for (const auto i : c10::irange(tensors.size())) {
    const std::string name = std::string(arg) + "[" + std::to_string(i) + "]";
    sameDeviceAndDtype(op, name.c_str(), reference, tensors[i]);
  }
}

void wholeIsSizeParts(const char* op, const char* wholeArg, const at::Tensor& whole,
                      const char* partArg, const at::Tensor& part, int size) {
  sameDeviceAndDtype(op, wholeArg, part, whole);
  STREAMNCCL_CHECK_ARG(whole.numel() == part.numel() * size, op, "`", wholeArg, "` has ",
                       whole.numel(), " elements (shape ", whole.sizes(), "), expected ", size,
                       " (world size) x ", part.numel(), " (the elements of `", partArg,
                       "`, shape ", part.sizes(), ") = ", part.numel() * size);
}

std::vector<int64_t> splitSizes(const char* op, const char* arg, const std::vector<int64_t>& splits,
                                const at::Tensor& tensor, int size) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  if (splits.empty()) {
    STREAMNCCL_CHECK_ARG(rows % size == 0, op, "`", arg, "` is empty (even split), so dim 0 (",
                         rows, ") must be divisible by the world size ", size);
    return std::vector<int64_t>(size, rows / size);
  }
  STREAMNCCL_CHECK_ARG(static_cast<int>(splits.size()) == size, op, "`", arg, "` has ",
                       splits.size(), " entries, expected one per rank: ", size);
  int64_t total = 0;
  for (const auto i : c10::irange(splits.size())) {
    STREAMNCCL_CHECK_ARG(splits[i] >= 0, op, "`", arg, "[", i, "]` is ", splits[i],
                         ", expected a size >= 0");
    total += splits[i];
  }
  STREAMNCCL_CHECK_ARG(total == rows, op, "`", arg, "` sums to ", total,
                       " rows, expected dim 0 of the tensor: ", rows);
  return splits;
}

void pairedLists(const char* op, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& outputs) {
  STREAMNCCL_CHECK_ARG(!inputs.empty() && inputs.size() == outputs.size(), op, "got ",
                       inputs.size(), " inputs and ", outputs.size(),
                       " outputs, expected the same number, at least one");
}

void rankMajorLists(const char* op, const char* outputsArg,
                    const std::vector<std::vector<at::Tensor>>& outputs, const char* inputsArg,
                    const std::vector<at::Tensor>& inputs, int size) {
  STREAMNCCL_CHECK_ARG(!inputs.empty(), op, "`", inputsArg, "` is empty");
  STREAMNCCL_CHECK_ARG(static_cast<int>(outputs.size()) == size, op, "`", outputsArg, "` has ",
                       outputs.size(), " lists, expected one per rank: ", size);
  for (const auto r : c10::irange(outputs.size())) {
    STREAMNCCL_CHECK_ARG(outputs[r].size() == inputs.size(), op, "`", outputsArg, "[", r, "]` has ",
                         outputs[r].size(), " tensors, expected one per tensor of `", inputsArg,
                         "`: ", inputs.size());
    for (const auto i : c10::irange(inputs.size())) {
      const std::string name =
          std::string(outputsArg) + "[" + std::to_string(r) + "][" + std::to_string(i) + "]";
      dense(op, inputsArg, inputs[i]);
      sameDeviceAndDtype(op, name.c_str(), inputs[i], outputs[r][i]);
      STREAMNCCL_CHECK_ARG(outputs[r][i].numel() == inputs[i].numel(), op, "`", name, "` has ",
                           outputs[r][i].numel(), " elements (shape ", outputs[r][i].sizes(),
                           "), expected as many as `", inputsArg, "[", i, "]`: ", inputs[i].numel(),
                           " (shape ", inputs[i].sizes(), ")");
    }
  }
}

void peerInRange(const char* op, const char* arg, int64_t peer, int size) {
  STREAMNCCL_CHECK_ARG(peer >= 0 && peer < size, op, "`", arg, "` is ", peer,
                       ", expected a rank in [0, ", size, ")");
}

}  // namespace streamnccl::checks
