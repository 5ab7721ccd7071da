#include "fake/FakeCollectives.hpp"

#include <ATen/ATen.h>
#include <c10/util/irange.h>

#include <optional>

namespace streamnccl::fake {

at::ScalarType scalarTypeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return at::kChar;
    case ncclUint8:
      return at::kByte;
    case ncclInt32:
      return at::kInt;
    case ncclUint32:
      return at::kUInt32;
    case ncclInt64:
      return at::kLong;
    case ncclUint64:
      return at::kUInt64;
    case ncclFloat16:
      return at::kHalf;
    case ncclFloat32:
      return at::kFloat;
    case ncclFloat64:
      return at::kDouble;
    case ncclBfloat16:
      return at::kBFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ncclFloat8e4m3:
      return at::kFloat8_e4m3fn;
    case ncclFloat8e5m2:
      return at::kFloat8_e5m2;
#endif
    default:
      TORCH_CHECK(false, "streamnccl fake: no dtype for ncclDataType ", static_cast<int>(type));
  }
}

namespace {

at::Tensor viewOf(const void* pointer, size_t count, ncclDataType_t type) {
  return at::from_blob(const_cast<void*>(pointer), {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(scalarTypeOf(type)));
}

// The type a reduction is computed in: exact for the small integers tests reduce.
at::ScalarType wideTypeOf(ncclDataType_t type) {
  return at::isFloatingType(scalarTypeOf(type)) ? at::kDouble : at::kLong;
}

double factorOf(const NcclOp& op) {
  if (op.hostFactor) {
    return *op.hostFactor;
  }
  // Read when the kernel runs, as NCCL reads a device-resident factor.
  return viewOf(op.deviceFactor, 1, op.type).to(at::kDouble).item<double>();
}

// The reduction of `parts` (member r's in parts[r], wide) by `op`.
at::Tensor reduce(std::vector<at::Tensor> parts, const std::vector<const NcclOp*>& ops) {
  const NcclOp& first = *ops.front();
  const bool premul = first.op >= ncclNumOps;  // a PreMulSum op made for the call
  if (premul) {
    for (const auto r : c10::irange(parts.size())) {
      parts[r] = parts[r] * factorOf(*ops[r]);
    }
  }
  at::Tensor result = parts.front().clone();
  for (size_t r = 1; r < parts.size(); ++r) {
    switch (premul ? ncclSum : first.op) {
      case ncclSum:
      case ncclAvg:
        result.add_(parts[r]);
        break;
      case ncclProd:
        result.mul_(parts[r]);
        break;
      case ncclMax:
        result = at::maximum(result, parts[r]);
        break;
      case ncclMin:
        result = at::minimum(result, parts[r]);
        break;
      default:
        TORCH_CHECK(false, "streamnccl fake: reduce op ", static_cast<int>(first.op));
    }
  }
  if (!premul && first.op == ncclAvg) {
    result.div_(static_cast<double>(parts.size()));
  }
  return result;
}

// Writes `value` into member r's recv buffer, if r's outputs are to be written.
void write(const NcclOp& op, size_t count, const at::Tensor& value) {
  viewOf(op.recv, count, op.type).copy_(value);
}

// Block r (of `count` elements) of each member's whole buffer, in member order.
std::vector<at::Tensor> blocksFor(int r, const std::vector<at::Tensor>& wholes, size_t count) {
  std::vector<at::Tensor> blocks;
  blocks.reserve(wholes.size());
  const auto length = static_cast<int64_t>(count);
  for (const auto& whole : wholes) {
    blocks.push_back(whole.narrow(0, r * length, length));
  }
  return blocks;
}

void run(const std::vector<const NcclOp*>& ops, std::optional<int> only) {
  const NcclOp& first = *ops.front();
  const int n = static_cast<int>(ops.size());
  // Member r's input, of `count` elements: widened (for a reduction), or as it is.
  auto input = [&](int r, size_t count, bool wide) {
    const at::Tensor view = viewOf(ops[r]->send, count, first.type);
    return (wide ? view.to(wideTypeOf(first.type)) : view).clone();
  };
  auto everyInput = [&](size_t count, bool wide) {
    std::vector<at::Tensor> parts;
    for (const auto r : c10::irange(n)) {
      parts.push_back(input(r, count, wide));
    }
    return parts;
  };
  // Writes `count` elements of resultFor(r) to every member r this run writes (`only`, or all).
  auto writeEach = [&](size_t count, const auto& resultFor) {
    for (const auto r : c10::irange(n)) {
      if (!only || *only == r) {
        write(*ops[r], count, resultFor(r));
      }
    }
  };
  switch (first.kind) {
    case NcclOp::Kind::AllReduce: {
      const at::Tensor result = reduce(everyInput(first.count, true), ops);
      writeEach(first.count, [&](int) { return result; });
      break;
    }
    case NcclOp::Kind::Reduce:
      if (!only || *only == first.root) {
        write(*ops[first.root], first.count, reduce(everyInput(first.count, true), ops));
      }
      break;
    case NcclOp::Kind::Broadcast: {
      const at::Tensor source = input(first.root, first.count, false);
      writeEach(first.count, [&](int) { return source; });
      break;
    }
    case NcclOp::Kind::AllGather: {
      const at::Tensor whole = at::cat(everyInput(first.count, false));
      writeEach(n * first.count, [&](int) { return whole; });
      break;
    }
    case NcclOp::Kind::ReduceScatter: {
      const std::vector<at::Tensor> wholes = everyInput(n * first.count, true);
      writeEach(first.count, [&](int r) { return reduce(blocksFor(r, wholes, first.count), ops); });
      break;
    }
    case NcclOp::Kind::AllToAll: {
      // Rank r's block q comes from rank q's block r. Every input is read before any output
      // is written, as if the ranks' buffers were apart (an overlap is refused at the call).
      const std::vector<at::Tensor> wholes = everyInput(n * first.count, false);
      writeEach(n * first.count, [&](int r) { return at::cat(blocksFor(r, wholes, first.count)); });
      break;
    }
    case NcclOp::Kind::Send:
    case NcclOp::Kind::Recv:
      TORCH_INTERNAL_ASSERT(false, "streamnccl fake: a message is not a collective");
  }
}

}  // namespace

void runCollective(const std::vector<const NcclOp*>& ops) { run(ops, std::nullopt); }

void runMirroredCollective(const NcclOp& op, int rank, int nranks) {
  run(std::vector<const NcclOp*>(nranks, &op), rank);
}

void runMessage(const NcclOp& send, const NcclOp& recv) {
  const size_t count = std::min(send.count, recv.count);
  viewOf(recv.recv, count, recv.type).copy_(viewOf(send.send, count, send.type));
}

}  // namespace streamnccl::fake
