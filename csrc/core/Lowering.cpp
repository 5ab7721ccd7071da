#include "core/Lowering.hpp"

#include "core/Errors.hpp"

#include <ATen/ATen.h>

namespace streamnccl {

std::string toString(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Sum:
      return "SUM";
    case ReduceKind::Avg:
      return "AVG";
    case ReduceKind::Product:
      return "PRODUCT";
    case ReduceKind::Min:
      return "MIN";
    case ReduceKind::Max:
      return "MAX";
    case ReduceKind::BitAnd:
      return "BAND";
    case ReduceKind::BitOr:
      return "BOR";
    case ReduceKind::BitXor:
      return "BXOR";
    case ReduceKind::PreMulSum:
      return "PREMUL_SUM";
  }
  return "unknown";
}

namespace lowering {
namespace {

std::string opName(c10d::ReduceOp::RedOpType type) {
  switch (type) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "op " + std::to_string(static_cast<int>(type));
  }
}

at::Tensor premulFactor(const char* op, const c10d::ReduceOp& reduceOp, const at::Tensor& tensor,
                        Kernels& kernels) {
  auto* supplement = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(reduceOp.supplement_.get());
  STREAMNCCL_CHECK_ARG(supplement != nullptr, op,
                       "PREMUL_SUM needs a factor; make the op with "
                       "torch.distributed._make_nccl_premul_sum(factor)");
  if (supplement->tensor_factor.defined()) {
    const at::Tensor& factor = supplement->tensor_factor;
    STREAMNCCL_CHECK_ARG(factor.numel() == 1, op, "PREMUL_SUM factor must have one element, got ",
                         factor.numel());
    STREAMNCCL_CHECK_ARG(factor.device() == tensor.device(), op, "PREMUL_SUM factor is on ",
                         factor.device(), " but the tensor is on ", tensor.device());
    return kernels.convert(factor, tensor.scalar_type()).reshape({});
  }
  // A scalar stays on the host: NCCL reads it at the call, and ATen multiplies by it anywhere.
  return at::scalar_tensor(supplement->double_factor,
                           at::TensorOptions().dtype(tensor.scalar_type()));
}

bool premulFactorIsTensor(const c10d::ReduceOp& reduceOp) {
  auto* supplement = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(reduceOp.supplement_.get());
  return supplement != nullptr && supplement->tensor_factor.defined();
}

}  // namespace

Reduction reduction(const char* op, const c10d::ReduceOp& reduceOp, const at::Tensor& tensor,
                    const Transport& communicator, Kernels& kernels) {
  const at::ScalarType dtype = tensor.scalar_type();
  const c10d::ReduceOp::RedOpType type = reduceOp.op_;
  if (at::isComplexType(dtype)) {
    STREAMNCCL_CHECK_TYPE(c10d::isComplexViewAsRealAllowed(reduceOp), op, "reduce op ",
                          opName(type), " is not defined for complex dtype ", dtype,
                          "; expected SUM, AVG or PREMUL_SUM");
  }
  Reduction lowered;
  switch (type) {
    case c10d::ReduceOp::SUM:
      lowered.kind = ReduceKind::Sum;
      break;
    case c10d::ReduceOp::PRODUCT:
      lowered.kind = ReduceKind::Product;
      break;
    case c10d::ReduceOp::MIN:
      lowered.kind = ReduceKind::Min;
      break;
    case c10d::ReduceOp::MAX:
      lowered.kind = ReduceKind::Max;
      break;
    case c10d::ReduceOp::BAND:
      lowered.kind = ReduceKind::BitAnd;
      break;
    case c10d::ReduceOp::BOR:
      lowered.kind = ReduceKind::BitOr;
      break;
    case c10d::ReduceOp::BXOR:
      lowered.kind = ReduceKind::BitXor;
      break;
    case c10d::ReduceOp::AVG:
      STREAMNCCL_CHECK_TYPE(at::isFloatingType(dtype) || at::isComplexType(dtype), op,
                            "reduce op AVG needs a floating-point or complex dtype, got ", dtype,
                            " (an integer mean is not an integer; use SUM and divide)");
      lowered.kind = ReduceKind::Avg;
      if (!communicator.supportsAvg(dtype)) {
        lowered.kind = ReduceKind::Sum;
        lowered.divideBySize = true;
      }
      break;
    case c10d::ReduceOp::PREMUL_SUM:
      STREAMNCCL_CHECK_TYPE(at::isFloatingType(dtype) || at::isComplexType(dtype), op,
                            "reduce op PREMUL_SUM needs a floating-point or complex dtype, got ",
                            dtype);
      // A complex buffer is reduced as its real view, which a complex factor cannot scale.
      if (communicator.supportsPreMulSum(dtype) && !at::isComplexType(dtype)) {
        lowered.kind = ReduceKind::PreMulSum;
        lowered.factor = premulFactor(op, reduceOp, tensor, kernels);
        lowered.factorOnHost = !premulFactorIsTensor(reduceOp);
      } else {
        lowered.kind = ReduceKind::Sum;
        lowered.premultiply = premulFactor(op, reduceOp, tensor, kernels);
      }
      break;
    default:
      STREAMNCCL_CHECK_ARG(false, op, "unknown reduce op ", opName(type));
  }
  const bool bitwise = lowered.kind == ReduceKind::BitAnd || lowered.kind == ReduceKind::BitOr ||
                       lowered.kind == ReduceKind::BitXor;
  if (bitwise) {
    STREAMNCCL_CHECK_TYPE(at::isIntegralType(dtype, /*includeBool=*/true), op, "reduce op ",
                          opName(type), " needs an integer or bool dtype, got ", dtype);
  }
  const at::ScalarType bufferType = at::isComplexType(dtype) ? c10::toRealValueType(dtype)
                                    : dtype == at::kBool     ? at::kByte
                                                             : dtype;
  const std::string refusal = communicator.reductionRefusal(lowered.kind, bufferType);
  STREAMNCCL_CHECK_TYPE(refusal.empty(), op, refusal);
  if (dtype == at::kBool) {
    // On 0/1 bytes, a logical or is MAX and a logical and is MIN; a byte SUM could overflow.
    if (lowered.kind == ReduceKind::Sum) lowered.kind = ReduceKind::Max;
    if (lowered.kind == ReduceKind::Product) lowered.kind = ReduceKind::Min;
  }
  return lowered;
}

TensorList Reduction::withFactors(const std::vector<at::Tensor>& tensors) const {
  if (!factor.defined() && !premultiply) {
    return tensors;
  }
  std::vector<at::Tensor> with = tensors;
  if (factor.defined()) {
    with.push_back(factor);
  }
  if (premultiply) {
    with.push_back(*premultiply);
  }
  return with;
}

c10::MaybeOwned<at::Tensor> reductionBuffer(const at::Tensor& contiguousTensor) {
  if (contiguousTensor.is_complex()) {
    return c10::MaybeOwned<at::Tensor>::owned(at::view_as_real(contiguousTensor));
  }
  if (contiguousTensor.scalar_type() == at::kBool) {
    return c10::MaybeOwned<at::Tensor>::owned(contiguousTensor.view(at::kByte));
  }
  return c10::MaybeOwned<at::Tensor>::borrowed(contiguousTensor);
}

at::Tensor bytes(const at::Tensor& contiguousTensor) {
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  return kernelBytes(contiguousTensor);
}

at::Tensor kernelBytes(const at::Tensor& contiguousTensor) {
  const at::Tensor flat =
      contiguousTensor.dim() == 1 ? contiguousTensor : contiguousTensor.reshape({-1});
  return flat.scalar_type() == at::kByte ? flat : flat.view(at::kByte);
}

at::Tensor premultiplied(Kernels& kernels, at::Tensor dense, const Reduction& reduction) {
  return reduction.premultiply ? kernels.multiply(dense, *reduction.premultiply) : std::move(dense);
}

void finishReduction(Kernels& kernels, const at::Tensor& result, const Reduction& reduction,
                     int size) {
  if (reduction.divideBySize) {
    kernels.divide(result, size);
  }
}

at::Tensor receiveBuffer(Kernels& kernels, const at::Tensor& output, bool apart) {
  return apart ? at::empty(output.sizes(), output.options()) : kernels.contiguous(output);
}

void copyBack(Kernels& kernels, const at::Tensor& target, const at::Tensor& computed) {
  if (!target.is_same(computed)) {
    kernels.copy(target, computed);
  }
}

}  // namespace lowering
}  // namespace streamnccl
