#include "core/InflightWrites.hpp"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <sstream>

namespace streamnccl {
namespace {

// Whether ATen counts writes to `tensor` (an inference tensor has no counter).
bool counted(const at::Tensor& tensor) {
  return tensor.defined() && tensor.unsafeGetTensorImpl()->version_counter().enabled();
}

uint32_t versionOf(const at::Tensor& tensor) {
  return tensor.unsafeGetTensorImpl()->version_counter().current_version();
}

const void* storageOf(const at::Tensor& tensor) {
  return tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl() : nullptr;
}

bool isIn(const at::Tensor& tensor, const std::vector<at::Tensor>& tensors) {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const at::Tensor& other) { return other.is_same(tensor); });
}

// An alias of `tensor` with a counter of its own, or `tensor` itself when it has none.
at::Tensor unversioned(const at::Tensor& tensor) {
  return counted(tensor) ? tensor.variable_data() : tensor;
}

constexpr const char* kAdvice =
    "wait() on the op's Work before writing its tensors, or pass async_op=False "
    "(found by STREAMNCCL_CHECK_INFLIGHT_WRITES)";

}  // namespace

std::shared_ptr<InflightWriteCheck> InflightWrites::watch(OpInfo info,
                                                          const std::vector<at::Tensor>& inputs,
                                                          const std::vector<at::Tensor>& outputs) {
  return std::make_shared<InflightWriteCheck>(shared_from_this(), std::move(info), inputs, outputs);
}

void InflightWrites::runOwnKernel(c10::ArrayRef<at::Tensor> written,
                                  c10::function_ref<void()> kernel) {
  // Held across the kernel: a judge never sees its bump without its credit.
  std::lock_guard<std::mutex> lock(mutex_);
  c10::SmallVector<uint32_t, 2> before;
  for (const auto& tensor : written) {
    before.push_back(counted(tensor) ? versionOf(tensor) : 0);
  }
  kernel();
  for (size_t i = 0; i < written.size(); ++i) {
    if (!counted(written[i])) {
      continue;
    }
    const uint32_t bumps = versionOf(written[i]) - before[i];
    auto credit = credits_.find(storageOf(written[i]));
    if (bumps > 0 && credit != credits_.end()) {
      credit->second.bumps += bumps;
    }
  }
}

InflightWriteCheck::InflightWriteCheck(std::shared_ptr<InflightWrites> group, OpInfo info,
                                       const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& outputs)
    : group_(std::move(group)), info_(std::move(info)) {
  watched_.reserve(inputs.size() + outputs.size());
  const auto add = [&](const at::Tensor& tensor, const char* list, size_t index) {
    if (counted(tensor)) {
      watched_.push_back(
          {list, index, tensor.unsafeGetTensorImpl()->version_counter(), storageOf(tensor), 0, 0});
    }
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    add(inputs[i], isIn(inputs[i], outputs) ? "tensors" : "inputs", i);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!isIn(outputs[i], inputs)) {
      add(outputs[i], "outputs", i);
    }
  }
  std::lock_guard<std::mutex> lock(group_->mutex_);
  for (auto& watched : watched_) {
    auto& credit = group_->credits_[watched.storage];
    ++credit.watchers;
    watched.creditAtLaunch = credit.bumps;
    watched.atLaunch = watched.counter.current_version();
  }
}

InflightWriteCheck::~InflightWriteCheck() {
  try {
    std::optional<std::string> neverWaited;
    {
      std::lock_guard<std::mutex> lock(group_->mutex_);
      if (!judged_) {
        neverWaited = atCompletion_;
      }
      if (watching_) {
        unwatch();
      }
    }
    if (neverWaited && !group_->logged_.exchange(true)) {
      LOG(WARNING) << *neverWaited << "; the op was never waited for: " << kAdvice
                   << ". Later such writes in this group are not logged.";
    }
  } catch (...) {  // a destructor: the warning is lost rather than the process
  }
}

void InflightWriteCheck::noteCompleted() {
  std::lock_guard<std::mutex> lock(group_->mutex_);
  if (watching_) {  // else a wait() judged the op already (its task was held back till then)
    atCompletion_ = foreignWrite("completion");
  }
}

void InflightWriteCheck::noteCompletionVisible() {
  std::lock_guard<std::mutex> lock(group_->mutex_);
  completionVisible_ = true;
}

void InflightWriteCheck::judgeAtWait() {
  std::optional<std::string> verdict;
  {
    std::lock_guard<std::mutex> lock(group_->mutex_);
    if (!judged_) {
      judged_ = true;
      atWait_ = completionVisible_ ? atCompletion_ : foreignWrite("wait()");
      unwatch();
    }
    verdict = atWait_;
  }
  TORCH_CHECK(!verdict, *verdict, "; ", kAdvice);
}

std::optional<std::string> InflightWriteCheck::foreignWrite(const char* when) const {
  for (const auto& watched : watched_) {
    const uint32_t now = watched.counter.current_version();
    const uint64_t own = group_->credits_.at(watched.storage).bumps - watched.creditAtLaunch;
    if (static_cast<uint64_t>(now - watched.atLaunch) <= own) {
      continue;
    }
    std::ostringstream out;
    out << info_.describe() << ": argument `" << watched.list << "[" << watched.index
        << "]` was written while the op was in flight (version " << watched.atLaunch
        << " at launch, " << now << " at " << when;
    if (own > 0) {
      out << "; " << own << " of those writes by streamnccl's own kernels";
    }
    out << ")";
    return out.str();
  }
  return std::nullopt;
}

void InflightWriteCheck::unwatch() {
  for (const auto& watched : watched_) {
    auto credit = group_->credits_.find(watched.storage);
    if (credit != group_->credits_.end() && --credit->second.watchers == 0) {
      group_->credits_.erase(credit);
    }
  }
  watching_ = false;
}

// Inputs too: a communicator may use an input as scratch (Gloo's algorithms may), and an input
// that is also the output stays one tensor, which tells the communicator to work in place.
UnversionedTransport::Buffers UnversionedTransport::unversionedPair(const at::Tensor& input,
                                                                    const at::Tensor& output) {
  at::Tensor out = unversioned(output);
  at::Tensor in = input.is_same(output) ? out : unversioned(input);
  return {std::move(in), std::move(out)};
}

void UnversionedTransport::allReduce(const at::Tensor& input, const at::Tensor& output,
                                     const ReduceOp& op, c10::Stream stream) {
  const auto buffers = unversionedPair(input, output);
  wrapped_.allReduce(buffers.input, buffers.output, op, stream);
}

void UnversionedTransport::broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                                     c10::Stream stream) {
  const auto buffers = unversionedPair(input, output);
  wrapped_.broadcast(buffers.input, buffers.output, root, stream);
}

void UnversionedTransport::allGather(const at::Tensor& input, const at::Tensor& output,
                                     c10::Stream stream) {
  const auto buffers = unversionedPair(input, output);
  wrapped_.allGather(buffers.input, buffers.output, stream);
}

void UnversionedTransport::allToAll(const at::Tensor& input, const at::Tensor& output,
                                    const std::vector<int64_t>& inSplits,
                                    const std::vector<int64_t>& outSplits, c10::Stream stream) {
  const auto buffers = unversionedPair(input, output);
  wrapped_.allToAll(buffers.input, buffers.output, inSplits, outSplits, stream);
}

void UnversionedTransport::reduce(const at::Tensor& input, const at::Tensor& output,
                                  const ReduceOp& op, int root, c10::Stream stream) {
  const auto buffers = unversionedPair(input, output);
  wrapped_.reduce(buffers.input, buffers.output, op, root, stream);
}

void UnversionedTransport::reduceScatter(const at::Tensor& input, const at::Tensor& output,
                                         const ReduceOp& op, c10::Stream stream) {
  const auto buffers = unversionedPair(input, output);
  wrapped_.reduceScatter(buffers.input, buffers.output, op, stream);
}

void UnversionedTransport::recv(const at::Tensor& output, int peer, c10::Stream stream) {
  wrapped_.recv(unversioned(output), peer, stream);
}

int UnversionedTransport::recvFromAnySource(const at::Tensor& output, c10::Stream stream) {
  return wrapped_.recvFromAnySource(unversioned(output), stream);
}

}  // namespace streamnccl
