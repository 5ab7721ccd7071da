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
  }
  return "unknown";
}

namespace lowering {

ReduceKind reduceKind(const char* op, const c10d::ReduceOp& reduceOp, at::ScalarType dtype) {
  ReduceKind kind = ReduceKind::Sum;
  switch (reduceOp.op_) {
    case c10d::ReduceOp::SUM:
      kind = ReduceKind::Sum;
      break;
    case c10d::ReduceOp::AVG:
      kind = ReduceKind::Avg;
      break;
    case c10d::ReduceOp::PRODUCT:
      kind = ReduceKind::Product;
      break;
    case c10d::ReduceOp::MIN:
      kind = ReduceKind::Min;
      break;
    case c10d::ReduceOp::MAX:
      kind = ReduceKind::Max;
      break;
    case c10d::ReduceOp::BAND:
      kind = ReduceKind::BitAnd;
      break;
    case c10d::ReduceOp::BOR:
      kind = ReduceKind::BitOr;
      break;
    case c10d::ReduceOp::BXOR:
      kind = ReduceKind::BitXor;
      break;
    default:
      STREAMNCCL_CHECK_ARG(false, op, "reduce op ", static_cast<int>(reduceOp.op_),
                           " (PREMUL_SUM) is not supported yet; expected SUM, AVG, PRODUCT, MIN, "
                           "MAX, BAND, BOR or BXOR");
  }
  if (at::isComplexType(dtype)) {
    STREAMNCCL_CHECK_TYPE(kind == ReduceKind::Sum || kind == ReduceKind::Avg, op, "reduce op ",
                          toString(kind), " is not defined for complex dtype ", dtype,
                          "; expected SUM or AVG");
  }
  const bool bitwise =
      kind == ReduceKind::BitAnd || kind == ReduceKind::BitOr || kind == ReduceKind::BitXor;
  if (bitwise) {
    STREAMNCCL_CHECK_TYPE(at::isIntegralType(dtype, /*includeBool=*/true), op, "reduce op ",
                          toString(kind), " needs an integer or bool dtype, got ", dtype);
  }
  return kind;
}

bool averageBySum(const char* op, const Communicator& communicator, at::ScalarType dtype) {
  if (communicator.supportsAvg(dtype)) {
    return false;
  }
  STREAMNCCL_CHECK_TYPE(at::isFloatingType(dtype) || at::isComplexType(dtype), op,
                        "reduce op AVG needs a floating-point or complex dtype, got ", dtype,
                        " (an integer mean is not an integer; use SUM and divide)");
  return true;
}

at::Tensor contiguous(const at::Tensor& tensor) { return tensor.contiguous(); }

at::Tensor asBuffer(const at::Tensor& contiguousTensor) {
  return contiguousTensor.is_complex() ? at::view_as_real(contiguousTensor) : contiguousTensor;
}

void copyBack(const at::Tensor& target, const at::Tensor& computed) {
  if (!target.is_same(computed)) {
    target.copy_(computed);
  }
}

}  // namespace lowering
}  // namespace streamnccl
