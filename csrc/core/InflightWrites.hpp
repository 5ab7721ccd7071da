#pragma once

// Options::checkInflightWrites: catches a program that writes a tensor of an async op before
// waiting for the op, the race the stream contract (Device.hpp, rules 3 and 5) leaves to the
// caller: on CUDA the write races the op's kernels, on the host the group's worker thread.
//
// ATen bumps a tensor's version counter at every in-place write, and a view shares its base's
// counter. So at the launch of an async op the group records the version of every tensor the op
// reads or writes, and judges them again:
//   - at wait(), against their versions then: a RuntimeError names the op, the argument and
//     both versions (as autograd raises for a saved tensor modified in place); the op's result
//     is there and the group stays usable;
//   - for an op never waited for, when its Work goes: against their versions when the op's task
//     ended (its completion, as the host sees it), logged once per group.
// An op whose completion the caller could see before wait() (is_completed() said so, or its
// future was handed out: DDP's comm hooks write the result in then()) is judged at wait() as if
// never waited for, since a write after its completion may have followed that.
//
// Only writes by something other than the group's own async ops count (a sync op runs on the
// caller's stream: one writing a tensor an async op has in flight is the same race). Their
// ATen kernels
// (copy-backs, AVG's division) bump counters as any write does: each one's bumps are measured
// and credited to the storage written (InflightWrites::runOwnKernel), under a lock the judging
// takes too, so whatever ATen bumps is credited and never seen half done; a later op of the
// group writing the same tensor, in stream order after this one, is credited in the same way.
// Their communicator writes go through aliases with counters of their own
// (UnversionedTransport), as NCCL's raw writes never count: Gloo copies into outputs on its
// own threads while the op waits for its peers, when they could not be told from the caller's.
//
// Views aside (a write to any view of a tensor's base counts, the counter being the base's), it
// errs one way only: a write may be credited to the group without being its own (one into a
// tensor sharing storage, but not a counter, with one the group wrote; one racing an op's own
// kernel), never the reverse. Sync ops are not judged: when the call returns, a host op has run
// and a CUDA op is queued on the caller's own stream, before anything the caller does next. On
// CUDA an op's task ends when it is issued, so an op never waited for is judged on nothing: a
// device synchronize, which the group cannot see, is a fine way to wait for it.

#include "core/Communicator.hpp"
#include "core/OpInfo.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace streamnccl {

class InflightWriteCheck;

// One per group with the check on: what the group's own kernels wrote, per storage watched, and
// whether the group has logged an op never waited for yet.
class InflightWrites : public std::enable_shared_from_this<InflightWrites> {
 public:
  // Records the versions of an async op's tensors now, at its launch (see InflightWriteCheck).
  std::shared_ptr<InflightWriteCheck> watch(OpInfo info, const std::vector<at::Tensor>& inputs,
                                            const std::vector<at::Tensor>& outputs);
  // Runs `kernel`, one of an async op's own ATen kernels, which writes `written`, and credits
  // the bumps it makes to the storages written.
  void runOwnKernel(c10::ArrayRef<at::Tensor> written, c10::function_ref<void()> kernel);

 private:
  friend class InflightWriteCheck;

  struct Credit {
    uint64_t bumps = 0;  // made by the group's own kernels since the storage was first watched
    int watchers = 0;    // ops watching the storage: at 0 the entry goes
  };

  std::mutex mutex_;                                 // the group's checks take it too
  std::unordered_map<const void*, Credit> credits_;  // by StorageImpl
  std::atomic<bool> logged_{false};
};

// One async op's check, shared by its Work and its task.
class InflightWriteCheck {
 public:
  InflightWriteCheck(std::shared_ptr<InflightWrites> group, OpInfo info,
                     const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs);
  // An op never waited for whose completion found a write logs it here (once per group).
  ~InflightWriteCheck();
  InflightWriteCheck(const InflightWriteCheck&) = delete;
  InflightWriteCheck& operator=(const InflightWriteCheck&) = delete;

  InflightWrites& group() { return *group_; }
  // In the op's task, after its own work and before its future completes (whose callbacks may
  // write the result): the versions at the op's completion.
  void noteCompleted();
  // The caller could see the op complete without wait() (is_completed(), the future).
  void noteCompletionVisible();
  // At a wait() that found the op succeeded; raises if a tensor was written meanwhile. Later
  // waits repeat the first one's verdict.
  void judgeAtWait();

 private:
  struct Watched {
    // As the message names it: "tensors[0]" (an input the op also writes), "inputs[1]",
    // "outputs[2]", counted in the op's lists of inputs and outputs.
    const char* list;
    size_t index;
    c10::VariableVersion counter;
    const void* storage;
    uint32_t atLaunch;
    uint64_t creditAtLaunch;
  };

  // With the group's lock held: what a write since the launch, by anything but the group's own
  // kernels, says (`when`: "wait()", "completion"), or nullopt.
  std::optional<std::string> foreignWrite(const char* when) const;
  // With the group's lock held: the storages are no longer watched by this op.
  void unwatch();

  const std::shared_ptr<InflightWrites> group_;
  const OpInfo info_;
  std::vector<Watched> watched_;
  // Guarded by the group's lock.
  bool watching_ = true;
  bool completionVisible_ = false;
  std::optional<std::string> atCompletion_;
  bool judged_ = false;
  std::optional<std::string> atWait_;
};

// The transport an async op's task uses while its writes are checked: every buffer reaches
// the wrapped one as an alias with a version counter of its own (Tensor::variable_data(), what
// Python's .data is), so that what it writes bumps no counter of the caller's, as NCCL's raw
// writes never do.
class UnversionedTransport final : public Transport {
 public:
  explicit UnversionedTransport(std::shared_ptr<Communicator> wrapped)
      : owned_(std::move(wrapped)), wrapped_(*owned_) {}

  bool supportsAvg(at::ScalarType dtype) const override { return wrapped_.supportsAvg(dtype); }
  bool supportsPreMulSum(at::ScalarType dtype) const override {
    return wrapped_.supportsPreMulSum(dtype);
  }
  std::string reductionRefusal(ReduceKind kind, at::ScalarType dtype) const override {
    return wrapped_.reductionRefusal(kind, dtype);
  }
  void allReduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                 c10::Stream stream) override;
  void broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                 c10::Stream stream) override;
  void allGather(const at::Tensor& input, const at::Tensor& output, c10::Stream stream) override;
  void reduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op, int root,
              c10::Stream stream) override;
  void reduceScatter(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                     c10::Stream stream) override;
  AllToAll allToAllKind() const override { return wrapped_.allToAllKind(); }
  void allToAll(const at::Tensor& input, const at::Tensor& output,
                const std::vector<int64_t>& inSplits, const std::vector<int64_t>& outSplits,
                c10::Stream stream) override;
  void send(const at::Tensor& input, int peer, c10::Stream stream) override {
    wrapped_.send(input, peer, stream);  // only reads it
  }
  void recv(const at::Tensor& output, int peer, c10::Stream stream) override;
  int recvFromAnySource(const at::Tensor& output, c10::Stream stream) override;
  void groupStart() override { wrapped_.groupStart(); }
  void groupEnd() override { wrapped_.groupEnd(); }

 private:
  struct Buffers {
    at::Tensor input;
    at::Tensor output;
  };
  static Buffers unversionedPair(const at::Tensor& input, const at::Tensor& output);

  const std::shared_ptr<Communicator> owned_;
  Communicator& wrapped_;
};

}  // namespace streamnccl
