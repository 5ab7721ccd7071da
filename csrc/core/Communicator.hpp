#pragma once

// The buffer-level interface the core lowers every op to, modelled on NCCL so that the NCCL
// implementation is a 1:1 mapping. A "buffer" is one dense, contiguous tensor: the
// communicator reads its data pointer, element count and dtype, never its shape or strides,
// and never sees tensor lists or c10d options. Every call is issued on `stream`, from inside a
// task the Device runs in order on that stream.

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>

namespace streamnccl {

enum class ReduceKind { Sum, Avg, Product, Min, Max, BitAnd, BitOr, BitXor, PreMulSum };

std::string toString(ReduceKind kind);

// A reduction as the communicator applies it. PreMulSum multiplies each rank's input by
// `factor` before summing: a 0-dim tensor of the buffer's dtype, either a scalar known at the
// call, on the CPU (`factorOnHost`), or a tensor on the buffer's device, which the reduction
// reads only when it runs.
struct ReduceOp {
  ReduceOp(ReduceKind kind) : kind(kind) {}  // NOLINT(google-explicit-constructor)
  ReduceOp(ReduceKind kind, at::Tensor factor, bool factorOnHost)
      : kind(kind), factor(std::move(factor)), factorOnHost(factorOnHost) {}

  ReduceKind kind;
  at::Tensor factor;
  bool factorOnHost = true;
};

// What an op's task calls: the data movement, and the brackets of a group of such calls. A
// Communicator is one, and more (its life, below); a task sees only this part, which a wrapper
// of the task's calls (UnversionedTransport, InflightWrites.hpp) implements alone.
class Transport {
 public:
  virtual ~Transport() = default;

  // Whether allReduce can take ReduceKind::Avg for this dtype. Where it cannot, the core
  // lowers AVG to a sum followed by a division on the same stream.
  virtual bool supportsAvg(at::ScalarType dtype) const = 0;
  // Whether reductions can take ReduceKind::PreMulSum for this dtype. Where they cannot, the
  // core multiplies first, then sums.
  virtual bool supportsPreMulSum(at::ScalarType dtype) const = 0;
  // Why the communicator cannot apply `kind` to a buffer of `dtype` (a reduction buffer's:
  // complex as its real dtype, bool as bytes), or empty when it can. The core checks it at
  // the call, after lowering (AVG and PREMUL_SUM may arrive as SUM).
  virtual std::string reductionRefusal(ReduceKind /*kind*/, at::ScalarType /*dtype*/) const {
    return {};
  }

  virtual void allReduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                         c10::Stream stream) = 0;
  // `input` is read on `root` only; `output` is written on every rank.
  virtual void broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                         c10::Stream stream) = 0;
  // `output` holds size() * input.numel() elements, rank r's input at offset r * count.
  virtual void allGather(const at::Tensor& input, const at::Tensor& output, c10::Stream stream) = 0;
  // `output` is written on `root` only.
  virtual void reduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                      int root, c10::Stream stream) = 0;
  // `input` holds size() * output.numel() elements; rank r receives the reduction of chunk r.
  virtual void reduceScatter(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                             c10::Stream stream) = 0;
  // Which all-to-all the communicator's library does itself, as one exchange: none (NCCL
  // before 2.28), one of equal blocks only (ncclAlltoAll), or one of any blocks (Gloo). Where
  // the op's blocks are not of that kind, the core lowers all_to_all to a group of sends and
  // recvs.
  enum class AllToAll { None, EqualBlocks, AnyBlocks };
  virtual AllToAll allToAllKind() const { return AllToAll::None; }
  // `input` and `output` are bytes: block r of `input`, inSplits[r] bytes in rank order, goes
  // to rank r, and block r of `output`, outSplits[r] bytes, comes from rank r, this rank's own
  // block included. Every split equal where allToAllKind() is EqualBlocks.
  virtual void allToAll(const at::Tensor& /*input*/, const at::Tensor& /*output*/,
                        const std::vector<int64_t>& /*inSplits*/,
                        const std::vector<int64_t>& /*outSplits*/, c10::Stream /*stream*/) {
    TORCH_INTERNAL_ASSERT(false, "streamnccl: this communicator has no all-to-all of its own");
  }
  virtual void send(const at::Tensor& input, int peer, c10::Stream stream) = 0;
  virtual void recv(const at::Tensor& output, int peer, c10::Stream stream) = 0;
  // Receives the next message any peer sends to this rank's lanes; returns the sender. Only
  // on the lanes PathFactory::openAnySource opens, so only communicators that can.
  virtual int recvFromAnySource(const at::Tensor& /*output*/, c10::Stream /*stream*/) {
    TORCH_INTERNAL_ASSERT(false, "streamnccl: this communicator cannot receive from any source");
  }

  // Calls between groupStart() and groupEnd() are issued as one: they may progress in any
  // order, so a send and a recv between the same two ranks cannot deadlock. Groups nest; the
  // outermost groupEnd() issues. Results are ready in stream order after groupEnd().
  virtual void groupStart() = 0;
  virtual void groupEnd() = 0;
};

// A transport with a life: it connects, may fail on its own, and ends (closed in order, or
// aborted by its group's break).
class Communicator : public Transport {
 public:
  // Blocks until the communicator is connected to its peers (NCCL's init completes once every
  // member has called it), the group's timeout passes, or it is aborted; raises
  // DistBackendError then. Communicators that connect at once do nothing.
  virtual void waitReady() {}
  // Gives up connecting, if it is still under way (the group is going away).
  virtual void stopConnecting() {}

  // Stops the communicator for good after a fault, so that calls blocked in it (and its
  // peers') fail instead of waiting forever. Called by its group's break (Watchdog.hpp) once
  // the ops in flight have failed, or on one no op is using (still connecting, or closing once
  // its ops ended); no call may be made afterwards.
  virtual void abort() = 0;
  // How a communicator that meets a fault outside any op (a split or shrink of it that failed,
  // which only stopping its kernels ends) asks its group to break: the group fails its ops in
  // flight and then aborts its communicators. Set by the group's watchdog (Watchdog::watch).
  using BreakRequest = std::function<void(const std::string& why)>;
  virtual void setBreakRequest(BreakRequest /*request*/) {}
  // Ends the communicator in order at the group's end, once its ops have completed: NCCL
  // finalizes it (flushing what it still has in flight, every member doing the same) and then
  // destroys it. In two steps, so that a rank starts finalizing all of its communicators before
  // it waits for any: a node's ranks finalize together, and need not close theirs in one
  // order. No call may be made afterwards.
  virtual void beginClose() {}
  // Waits for beginClose()'s finalizing, by `deadline`, and destroys the communicator. Returns
  // why it had to be aborted (or left) instead, or empty.
  virtual std::string endClose(std::chrono::steady_clock::time_point /*deadline*/) { return {}; }
  // Work on this communicator was captured into a CUDA graph (which NCCL ties it to).
  virtual void noteCaptured() {}
  // The same on every member: ranks order the calls NCCL makes collective among a node's
  // ranks (abort, finalize) by it, so that they meet in one order.
  virtual const std::string& key() const {
    static const std::string none;
    return none;
  }
  // A fault the communicator found on its own, outside any call (NCCL's asynchronous
  // errors), described; empty when there is none. Polled by the watchdog.
  virtual std::string asyncError() = 0;

  // Registers `bytes` of memory at `address` with the communicator (NCCL's ncclCommRegister),
  // so that its ops use it in place; once per address until deregistered. Not collective.
  // Communicators without registration refuse it, naming `who`.
  virtual void registerMemory(void* /*address*/, size_t /*bytes*/, const std::string& who) {
    TORCH_CHECK(false, who, ": this path's communicator registers no memory (NCCL only)");
  }
  // Whether `address` is registered with it now.
  virtual bool isRegistered(void* /*address*/) { return false; }
  // Ends the registration of `address` (NCCL's ncclCommDeregister). The caller has made sure
  // that no op using the memory is still queued: NCCL would unmap it under a running kernel.
  virtual void deregisterMemory(void* /*address*/, const std::string& who) {
    TORCH_CHECK(false, who, ": this path's communicator registers no memory (NCCL only)");
  }
};

// Brackets communicator calls into one group, and ends it even when a call in it throws: NCCL's
// group is the calling thread's, and one left open would swallow that thread's next calls.
class CommunicatorGroup {
 public:
  explicit CommunicatorGroup(Transport& communicator) : communicator_(communicator) {
    communicator_.groupStart();
  }
  ~CommunicatorGroup() {
    if (!ended_) {
      try {
        communicator_.groupEnd();
      } catch (...) {  // unwinding already: the first error is the one that matters
      }
    }
  }
  CommunicatorGroup(const CommunicatorGroup&) = delete;
  CommunicatorGroup& operator=(const CommunicatorGroup&) = delete;

  // Issues the group (and raises its failure).
  void end() {
    ended_ = true;
    communicator_.groupEnd();
  }

 private:
  Transport& communicator_;
  bool ended_ = false;
};

}  // namespace streamnccl
