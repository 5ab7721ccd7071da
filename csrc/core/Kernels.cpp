#include "core/Kernels.hpp"

#include "core/InflightWrites.hpp"

#include <ATen/ATen.h>

namespace streamnccl {
namespace {

// Each kernel writes outputs[0] from its inputs.
const Kernel kCopy{"copy_", [](c10::ArrayRef<at::Tensor> out, c10::ArrayRef<at::Tensor> in,
                               int64_t) { out[0].copy_(in[0]); }};
const Kernel kMultiply{"mul",
                       [](c10::ArrayRef<at::Tensor> out, c10::ArrayRef<at::Tensor> in, int64_t) {
                         at::Tensor product = out[0];
                         at::mul_out(product, in[0], in[1]);
                       }};
const Kernel kDivide{"div_", [](c10::ArrayRef<at::Tensor> out, c10::ArrayRef<at::Tensor>,
                                int64_t divisor) { out[0].div_(divisor); }};
const Kernel kConcatenate{"cat",
                          [](c10::ArrayRef<at::Tensor> out, c10::ArrayRef<at::Tensor> in, int64_t) {
                            at::Tensor whole = out[0];
                            at::cat_out(whole, in.vec());
                          }};
const Kernel kZero{"zero_", [](c10::ArrayRef<at::Tensor> out, c10::ArrayRef<at::Tensor>, int64_t) {
                     out[0].zero_();
                   }};

}  // namespace

void Kernels::launch(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                     c10::ArrayRef<at::Tensor> inputs, int64_t scalar) {
  if (ownWrites_ == nullptr) {
    device_.launch(kernel, outputs, inputs, scalar);
    return;
  }
  ownWrites_->runOwnKernel(outputs, [&] { device_.launch(kernel, outputs, inputs, scalar); });
}

at::Tensor Kernels::contiguous(const at::Tensor& tensor) {
  if (tensor.is_contiguous()) {
    return tensor;
  }
  at::Tensor dense = at::empty(tensor.sizes(), tensor.options());
  launch(kCopy, {dense}, {tensor}, 0);
  return dense;
}

void Kernels::copy(const at::Tensor& target, const at::Tensor& source) {
  launch(kCopy, {target}, {source}, 0);
}

at::Tensor Kernels::convert(const at::Tensor& tensor, at::ScalarType dtype) {
  if (tensor.scalar_type() == dtype) {
    return tensor;
  }
  at::Tensor converted = at::empty(tensor.sizes(), tensor.options().dtype(dtype));
  launch(kCopy, {converted}, {tensor}, 0);
  return converted;
}

at::Tensor Kernels::multiply(const at::Tensor& tensor, const at::Tensor& factor) {
  at::Tensor product = at::empty(tensor.sizes(), tensor.options());
  launch(kMultiply, {product}, {tensor, factor}, 0);
  return product;
}

void Kernels::divide(const at::Tensor& tensor, int64_t divisor) {
  launch(kDivide, {tensor}, {}, divisor);
}

at::Tensor Kernels::concatenate(const std::vector<at::Tensor>& parts) {
  int64_t count = 0;
  std::vector<at::Tensor> flat;
  flat.reserve(parts.size());
  for (const auto& part : parts) {
    flat.push_back(part.view({-1}));
    count += part.numel();
  }
  at::Tensor whole = at::empty({count}, parts.front().options());
  launch(kConcatenate, {whole}, flat, 0);
  return whole;
}

at::Tensor Kernels::zeros(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor zeros = at::empty(sizes, options);
  launch(kZero, {zeros}, {}, 0);
  return zeros;
}

}  // namespace streamnccl
