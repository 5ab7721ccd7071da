#pragma once

// Test-only. What a fake GPU's streams hold: the work items of the NCCL path (ATen kernels and
// NCCL kernels), stream waits, the allocator's deferred poisoning, and the reads and writes a
// test makes on a stream as a user's own kernels would. An item never owns memory: it keeps
// raw pointers and views, so that whether the memory is still held when the item runs is up to
// the code under test, and checked (FakeGpu::checkBuffers).

#include "fake/FakeMemory.hpp"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace streamnccl::fake {

using StreamId = int64_t;
using EventId = int64_t;

// The memory an item reads or writes, as FakeMemory knew it when the item was issued.
struct Buffer {
  const void* pointer = nullptr;
  const char* role = "";  // "send", "recv", "PreMulSum factor", "output", "input", ...
  FakeMemory::Block atCall;
};

// A tensor as raw memory and layout, made into a view again when its item runs.
struct TensorView {
  void* data = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  at::ScalarType dtype = at::kByte;

  static TensorView of(const at::Tensor& tensor);
  at::Tensor view() const;
};

// One NCCL operation of a kernel.
struct NcclOp {
  enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Send, Recv };
  Kind kind = Kind::AllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // allGather, allToAll: per rank; reduceScatter: per rank (the recv count)
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;  // broadcast, reduce; the peer of a send or recv
  // A PreMulSum op's factor: a host scalar read at the call, or a device scalar read when the
  // kernel runs.
  std::optional<double> hostFactor;
  const void* deviceFactor = nullptr;
  // Its member's n-th collective on the communicator, or n-th message to or from the peer:
  // NCCL matches operations across members in this order. Given when enqueued on a stream.
  uint64_t index = 0;
  // Its buffers run past the end of their allocations (a violation): it moves nothing.
  bool outOfBounds = false;

  bool collective() const { return kind != Kind::Send && kind != Kind::Recv; }
};

// One NCCL kernel: the calls a member issued together on one communicator (a call, or an
// NCCL group's calls).
struct NcclLaunch {
  uint64_t comm = 0;  // the world's key of the communicator
  std::string commName;
  int rank = 0;
  int nranks = 1;
  std::vector<NcclOp> ops;
  bool stopped = false;  // ncclCommAbort: it exits at once, moving nothing
};

struct Item {
  enum class Kind { Aten, Nccl, Wait, Poison, Host };
  Kind kind = Kind::Aten;
  std::string name;
  std::vector<Buffer> buffers;
  uint64_t issued = 0;  // the GPU's issue order, which a single hardware queue keeps
  uint64_t replay = 0;  // the replay it belongs to (0: none): its buffers are the capture's

  // Aten: run(outputs, inputs, scalar) on views of them.
  void (*run)(c10::ArrayRef<at::Tensor>, c10::ArrayRef<at::Tensor>, int64_t) = nullptr;
  std::vector<TensorView> outputs;
  std::vector<TensorView> inputs;
  int64_t scalar = 0;
  // Nccl
  std::shared_ptr<NcclLaunch> launch;
  // Wait: this stream waits until `waitStream` has run `waitPosition` items.
  StreamId waitStream = 0;
  uint64_t waitPosition = 0;
  // Poison: the block at `data`, freed as `generation`.
  uint8_t* data = nullptr;
  uint64_t generation = 0;
  // Host: a test's own work on the stream.
  std::function<void()> host;
};

}  // namespace streamnccl::fake
