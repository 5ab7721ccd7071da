#include "host/HostCommunicator.hpp"

#include "core/Backoff.hpp"
#include "core/Errors.hpp"
#include "core/GroupThreads.hpp"
#include "host/HostDevice.hpp"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

namespace streamnccl {

namespace {

// Gloo names each of its ops in a profile ("gloo:all_reduce"), beside the op's own
// record_param_comms range: the op is streamnccl's, and shows once. The guard costs more than
// a small Gloo op's own bookkeeping, so it is only taken when something observes.
template <typename Call>
auto unobserved(Call call) {
  if (!at::hasCallbacks()) {
    return call();
  }
  at::DisableRecordFunctionGuard notRecorded;
  return call();
}

c10d::ReduceOp toGloo(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Sum:
      return c10d::ReduceOp::SUM;
    case ReduceKind::Product:
      return c10d::ReduceOp::PRODUCT;
    case ReduceKind::Min:
      return c10d::ReduceOp::MIN;
    case ReduceKind::Max:
      return c10d::ReduceOp::MAX;
    case ReduceKind::BitAnd:
      return c10d::ReduceOp::BAND;
    case ReduceKind::BitOr:
      return c10d::ReduceOp::BOR;
    case ReduceKind::BitXor:
      return c10d::ReduceOp::BXOR;
    case ReduceKind::Avg:
    case ReduceKind::PreMulSum:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "streamnccl: the core lowers ", toString(kind),
                        " before the host communicator");
}

// How long a sync op's caller looks for its Gloo collective to complete before it sleeps on it.
// A collective on few bytes completes a few µs after it is posted, on Gloo's worker, which runs
// on another CPU: a caller that slept at once pays a wake across CPUs for each op, tens of µs on
// a VM (docs/performance.md, "A sync op's wait"). An async op's caller has its own launch
// to finish and returns to Python before it waits, time in which the call mostly completes.
constexpr auto kLookBeforeSleeping = std::chrono::microseconds(20);

// Looks for `call` to complete, yielding the CPU between looks (Gloo's thread first, where it
// shares this one), for up to kLookBeforeSleeping; the wait that follows sleeps if it has not.
void lookBeforeSleeping(const c10::intrusive_ptr<c10d::Work>& call) {
  const auto until = std::chrono::steady_clock::now() + kLookBeforeSleeping;
  while (!call->isCompleted() && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
}

// Waits for a Gloo call. Its deadline (the group's timeout) passing is raised as a TimeoutError,
// as the watchdog's would be (Gloo says so only in its message: "Timed out waiting ...").
void waitForGloo(const c10::intrusive_ptr<c10d::Work>& work) {
  if (auto failure = HostStream::waitFor(work)) {
    std::rethrow_exception(failure);
  }
}

// The buffer itself when the op may write into it, else `output` with the input copied in.
const at::Tensor& inPlace(const at::Tensor& input, const at::Tensor& output) {
  if (!input.is_same(output)) {
    output.copy_(input);
  }
  return output;
}

}  // namespace

HostCommunicator::HostCommunicator(c10::intrusive_ptr<c10d::Backend> gloo, int tag,
                                   std::shared_ptr<HostStream> stream,
                                   std::shared_ptr<LazyGloo> opened)
    : gloo_(std::move(gloo)),
      rank_(gloo_->getRank()),
      tag_(tag),
      stream_(std::move(stream)),
      opened_(std::move(opened)) {}

HostCommunicator::~HostCommunicator() {
  if (onGroupThread()) {
    letGoOfGloo(std::exchange(gloo_, {}));
  }
}

HostCommunicator::InGloo::InGloo(HostCommunicator& communicator) : communicator_(communicator) {
  std::lock_guard<std::mutex> lock(communicator.glooMutex_);
  communicator.refuseIfAborted();  // gloo_ may be gone
  ++communicator.inGloo_;
}

HostCommunicator::InGloo::~InGloo() {
  c10::intrusive_ptr<c10d::Backend> released;
  {
    std::lock_guard<std::mutex> lock(communicator_.glooMutex_);
    --communicator_.inGloo_;
    released = communicator_.releasable();
  }
  letGoOfGloo(std::move(released));
}

c10::intrusive_ptr<c10d::Backend> HostCommunicator::releasable() {
  if (!aborted_.load() || inGloo_ > 0) {
    return {};
  }
  return std::exchange(gloo_, {});
}

void HostCommunicator::abort() {
  aborted_.store(true);
  c10::intrusive_ptr<c10d::Backend> released;
  {
    std::lock_guard<std::mutex> lock(glooMutex_);
    released = releasable();
  }
  letGoOfGloo(std::move(released));
  if (stream_) {
    stream_->abortCalls();
  }
  if (opened_) {
    opened_->close();
  }
}

template <typename Post>
void HostCommunicator::issue(c10::Stream stream, std::optional<int> peer, Completion completion,
                             Post post) {
  if (groupDepth_ > 0) {
    // Posted at the group's end, each as soon as its peers have opened Gloo (postGrouped).
    grouped_.push_back(Grouped{peer, completion, std::move(post)});
    groupStream_ = stream;
    return;
  }
  if (opened_) {
    opened_->awaitOpen(peer, [this] { return aborted_.load(); });
  }
  c10::intrusive_ptr<c10d::Work> work;
  {
    InGloo inGloo(*this);
    work = post();
  }
  finish(stream, work, completion);
}

bool HostCommunicator::handsOver(c10::Stream stream) const {
  return stream_ && stream.id() == HostDevice::kInternalStream;
}

void HostCommunicator::finish(c10::Stream stream, const c10::intrusive_ptr<c10d::Work>& work,
                              Completion completion) {
  if (handsOver(stream)) {
    stream_->awaitCall(work, completion);
    return;
  }
  if (completion == Completion::Future) {  // a send or a receive completes in its wait alone
    lookBeforeSleeping(work);
  }
  waitForGloo(work);
}

void HostCommunicator::allReduce(const at::Tensor& input, const at::Tensor& output,
                                 const ReduceOp& op, c10::Stream stream) {
  refuseIfAborted();
  std::vector<at::Tensor> tensors{inPlace(input, output)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = toGloo(op.kind);
  issue(stream, std::nullopt, Completion::Future, [=, this]() mutable {
    return unobserved([&] { return gloo_->allreduce(tensors, opts); });
  });
}

void HostCommunicator::broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                                 c10::Stream stream) {
  refuseIfAborted();
  std::vector<at::Tensor> tensors{rank_ == root ? inPlace(input, output) : output};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  issue(stream, std::nullopt, Completion::Future, [=, this]() mutable {
    return unobserved([&] { return gloo_->broadcast(tensors, opts); });
  });
}

void HostCommunicator::allGather(const at::Tensor& input, const at::Tensor& output,
                                 c10::Stream stream) {
  refuseIfAborted();
  // Flat views: buffers carry a count, and Gloo checks each output chunk's shape.
  at::Tensor in = input.view(-1);
  at::Tensor out = output.view(-1);
  issue(stream, std::nullopt, Completion::Future, [=, this]() mutable {
    return unobserved([&] { return gloo_->_allgather_base(out, in); });
  });
}

void HostCommunicator::reduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                              int root, c10::Stream stream) {
  refuseIfAborted();
  // Gloo may use every rank's buffer as scratch; only the root's output is ours to write.
  std::vector<at::Tensor> tensors{rank_ == root ? inPlace(input, output)
                                                : copyToScratch(input, stream)};
  c10d::ReduceOptions opts;
  opts.reduceOp = toGloo(op.kind);
  opts.rootRank = root;
  issue(stream, std::nullopt, Completion::Future,
        [=, this]() mutable { return unobserved([&] { return gloo_->reduce(tensors, opts); }); });
}

void HostCommunicator::reduceScatter(const at::Tensor& input, const at::Tensor& output,
                                     const ReduceOp& op, c10::Stream stream) {
  refuseIfAborted();
  at::Tensor in = input.view(-1);
  at::Tensor out = output.view(-1);
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = toGloo(op.kind);
  issue(stream, std::nullopt, Completion::Future, [=, this]() mutable {
    return unobserved([&] { return gloo_->_reduce_scatter_base(out, in, opts); });
  });
}

void HostCommunicator::allToAll(const at::Tensor& input, const at::Tensor& output,
                                const std::vector<int64_t>& inSplits,
                                const std::vector<int64_t>& outSplits, c10::Stream stream) {
  refuseIfAborted();
  // Gloo takes its arguments by reference, as c10d's Backend declares them. Even splits go as
  // none: Gloo then takes its all-to-all of equal blocks, faster than the one of any blocks.
  at::Tensor in = input;
  at::Tensor out = output;
  auto even = [](const std::vector<int64_t>& splits) {
    return std::adjacent_find(splits.begin(), splits.end(), std::not_equal_to<>()) == splits.end();
  };
  std::vector<int64_t> inBytes;
  std::vector<int64_t> outBytes;
  if (!even(inSplits) || !even(outSplits)) {
    inBytes = inSplits;
    outBytes = outSplits;
  }
  issue(stream, std::nullopt, Completion::Future, [=, this]() mutable {
    return unobserved(
        [&] { return gloo_->alltoall_base(out, in, outBytes, inBytes, c10d::AllToAllOptions()); });
  });
}

// User tags: the Communicator, like NCCL, has none. Gloo matches messages between two ranks
// with the same tag in the order they were posted, and each stream posts in program order,
// so one tag per concurrently running stream is enough.
void HostCommunicator::send(const at::Tensor& input, int peer, c10::Stream stream) {
  refuseIfAborted();
  std::vector<at::Tensor> tensors{input};
  issue(stream, peer, Completion::Wait, [=, this]() mutable {
    return unobserved([&] { return gloo_->send(tensors, peer, tag_); });
  });
}

void HostCommunicator::recv(const at::Tensor& output, int peer, c10::Stream stream) {
  refuseIfAborted();
  std::vector<at::Tensor> tensors{output};
  issue(stream, peer, Completion::Wait, [=, this]() mutable {
    return unobserved([&] { return gloo_->recv(tensors, peer, tag_); });
  });
}

int HostCommunicator::recvFromAnySource(const at::Tensor& output, c10::Stream /*stream*/) {
  // Waited for wherever it runs: its source is known only then (its lane's tasks run on the
  // stream's worker: HostPath).
  refuseIfAborted();
  TORCH_INTERNAL_ASSERT(groupDepth_ == 0, "streamnccl: a recv from any source inside a group");
  if (opened_) {  // Gloo connects to every member for it
    opened_->awaitOpen(std::nullopt, [this] { return aborted_.load(); });
  }
  std::vector<at::Tensor> tensors{output};
  c10::intrusive_ptr<c10d::Work> work;
  {
    InGloo inGloo(*this);
    work = unobserved([&] { return gloo_->recvAnysource(tensors, tag_); });
  }
  if (!stream_) {
    waitForGloo(work);
  } else if (auto failure = stream_->waitWatched(work)) {  // a break ends it at once
    std::rethrow_exception(failure);
  }
  return work->sourceRank();
}

at::Tensor HostCommunicator::copyToScratch(const at::Tensor& input, c10::Stream stream) {
  const auto bytes = static_cast<int64_t>(input.nbytes());
  // Ops of one group, or on the internal stream, are in flight together: each needs a buffer
  // of its own.
  if (groupDepth_ > 0 || handsOver(stream) || bytes > kKeptScratchBytes) {
    return input.clone();
  }
  if (!scratch_.defined() || scratch_.numel() < bytes) {
    scratch_ = at::empty({bytes}, input.options().dtype(at::kByte));
  }
  at::Tensor copy = scratch_.narrow(0, 0, bytes).view(input.scalar_type()).view(input.sizes());
  copy.copy_(input);
  return copy;
}

void HostCommunicator::refuseIfAborted() const {
  if (aborted_) {
    throwDistBackendError("the host communicator was aborted");
  }
}

void HostCommunicator::groupStart() { ++groupDepth_; }

void HostCommunicator::groupEnd() {
  TORCH_INTERNAL_ASSERT(groupDepth_ > 0, "streamnccl: groupEnd() without groupStart()");
  if (--groupDepth_ > 0) {
    return;
  }
  auto grouped = std::exchange(grouped_, {});
  InGloo inGloo(*this);
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, Completion>> posted;
  try {
    postGrouped(grouped, posted);
  } catch (...) {
    // What was posted is still seen through: Gloo uses its buffers until it completes.
    for (auto& [work, completion] : posted) {
      try {
        finish(groupStream_, work, completion);
      } catch (...) {  // the first failure is the one to report
      }
    }
    throw;
  }
  for (auto& [work, completion] : posted) {
    finish(groupStream_, work, completion);
  }
}

void HostCommunicator::postGrouped(
    std::vector<Grouped>& grouped,
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, Completion>>& posted) {
  if (!opened_) {
    for (auto& call : grouped) {
      posted.emplace_back(call.post(), call.completion);
    }
    return;
  }
  // Each call is posted once the ranks it exchanges with have opened Gloo, so that a late
  // peer holds up its own calls alone (in a group they may progress in any order): calls to
  // one peer keep their order, and so do collectives among themselves.
  if (!opened_->knownOpen(std::nullopt)) {
    // One look at every member: once all have opened Gloo, the stream's later ops post at
    // once, where until then they run on its worker (HostPath), since one may have to wait.
    opened_->isOpen(std::nullopt);
  }
  const auto deadline = opened_->deadlineFromNow();
  Backoff backoff(std::chrono::microseconds(200), std::chrono::microseconds(20000));
  while (!grouped.empty()) {
    std::set<int> heldPeers;
    bool collectiveHeld = false;
    bool progressed = false;
    std::vector<Grouped> later;
    for (auto& call : grouped) {
      const bool held = call.peer ? heldPeers.count(*call.peer) > 0 : collectiveHeld;
      if (!held && opened_->isOpen(call.peer)) {
        posted.emplace_back(call.post(), call.completion);
        progressed = true;
        continue;
      }
      if (call.peer) {
        heldPeers.insert(*call.peer);
      } else {
        collectiveHeld = true;
      }
      later.push_back(std::move(call));
    }
    grouped = std::move(later);
    if (grouped.empty() || progressed) {
      backoff.reset();
      continue;
    }
    refuseIfAborted();
    opened_->raiseIfPast(deadline, grouped.front().peer);
    backoff.pause();
  }
}

}  // namespace streamnccl
