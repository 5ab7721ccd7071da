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

const std::vector<at::Tensor>& allGatherOutputs(const char* op,
                                                const std::vector<std::vector<at::Tensor>>& outputs,
                                                const at::Tensor& input, int size) {
  STREAMNCCL_CHECK_ARG(outputs.size() == 1, op,
                       "expected one output list (one tensor per process), got ", outputs.size());
  const auto& list = outputs[0];
  STREAMNCCL_CHECK_ARG(static_cast<int>(list.size()) == size, op, "`output_tensor_list` has ",
                       list.size(), " tensors, expected one per rank: ", size);
  for (const auto i : c10::irange(list.size())) {
    const std::string arg = "output_tensor_list[" + std::to_string(i) + "]";
    sameDeviceAndDtype(op, arg.c_str(), input, list[i]);
    STREAMNCCL_CHECK_ARG(list[i].numel() == input.numel(), op, "`", arg, "` has ", list[i].numel(),
                         " elements (shape ", list[i].sizes(),
                         "), expected as many as the input: ", input.numel(), " (shape ",
                         input.sizes(), ")");
  }
  return list;
}

}  // namespace streamnccl::checks
