// Test-only. RecordingNccl's communicators made from another: ncclCommShrink and
// ncclCommSplit, made on "NCCL's thread" (finished by a poll of the parent) while the parent
// stays busy, and the parent's link to the new one's abort flag.

#include "fake/FakeNcclConfig.hpp"
#include "fake/RecordingNccl.hpp"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <thread>

namespace streamnccl::fake {

ncclResult_t RecordingNccl::commShrink(ncclComm_t handleValue, int* excludeRanksList,
                                       int excludeRanksCount, ncclComm_t* newcomm,
                                       ncclConfig_t* config, int shrinkFlags) {
  const std::vector<int> excluded(excludeRanksList, excludeRanksList + excludeRanksCount);
  const bool abortFirst = (shrinkFlags & NCCL_SHRINK_ABORT) != 0;
  std::string call = "ncclCommShrink(" + commName(handleValue) + ", exclude=[" +
                     c10::Join(",", excluded) + "]" + (abortFirst ? ", abort" : "") +
                     configText(config) + ")";
  if (const std::string refusal = configRefusal(config); !refusal.empty()) {
    gpu_->log().add(call + " failed: NCCL refuses the config (" + refusal + ")");
    return ncclInvalidArgument;
  }
  if (gpu_->ncclVersion() < NCCL_VERSION(2, 27, 0)) {
    gpu_->log().violation(call + " with NCCL " + std::to_string(gpu_->ncclVersion()) +
                          ", which has no ncclCommShrink (2.27+)");
    return ncclInvalidUsage;
  }
  gpu_->bindDevice();
  std::unique_lock<std::mutex> lock(mutex_);
  Comm* parent = parentFor(handleValue, call);
  if (parent == nullptr) {
    return ncclInvalidArgument;
  }
  if (std::count(excluded.begin(), excluded.end(), parent->rank) > 0) {
    gpu_->log().violation(call + " by rank " + std::to_string(parent->rank) +
                          ", which it excludes");
  }
  const bool modelled = gpu_->models().shrink;
  if (const ncclResult_t injected = outcome("ncclCommShrink"); injected != ncclSuccess) {
    gpu_->log().add(call + " failed");
    return injected;
  }
  if (abortFirst && modelled) {
    // The parent's operations in flight quit; the parent itself stays to be freed.
    gpu_->stopLaunches(parent->key, parent->rank);
  } else {
    refuseOutstanding(*parent, call);
  }
  // The survivors meet by what they share: the parent, which of its shrinks, whom it left out,
  // renumbered in order without the excluded. (Unmodelled: the parent's members, unchanged.)
  const uint64_t key = FakeNcclWorld::shrunkKey(parent->key, parent->shrinks++, excluded);
  const auto before = [&](int out) { return out < parent->rank; };
  const int rank =
      modelled
          ? parent->rank - static_cast<int>(std::count_if(excluded.begin(), excluded.end(), before))
          : parent->rank;
  const int nranks = modelled ? parent->nranks - static_cast<int>(excluded.size()) : parent->nranks;
  const int device = parent->device;
  const bool blocking = blocksWith(config);
  const bool shares = !abortFirst && parent->shrinksShare;
  // The new one's own config is the shrink's, or else its parent's (then the environment).
  const bool childShrinksShare =
      config != nullptr ? shrinksShareWith(config) : parent->shrinksShare;
  world_->join(key, rank, nranks, gpu_.get());
  if (blocking && modelled) {
    lock.unlock();
    if (!world_->waitComplete(key, kBlockingInitWait)) {
      gpu_->log().add(call + " never met the other survivors");
      return ncclSystemError;
    }
    lock.lock();
  }
  const int64_t number = commsMade_++;  // named now, for the log
  gpu_->log().add(call + " -> " + commName(handle<ncclComm_t>(number)) + " (rank " +
                  std::to_string(rank) + " of " + std::to_string(nranks) + ")" +
                  (shares ? ", sharing its parent's resources" : ""));
  if (!blocking && modelled) {
    // NCCL's own thread makes it, tied to the parent, and writes it only once done.
    *newcomm = nullptr;
    parent->shrinking = Comm::Shrinking{newcomm, number, fake::number(handleValue), key, rank,
                                        nranks,  shares, childShrinksShare};
    parent->childAbortFlag = number;
    return ncclInProgress;
  }
  *newcomm = handle<ncclComm_t>(number);
  Comm& child = made(number, device, nranks, rank, key, blocking);
  child.shrinksShare = childShrinksShare;
  if (shares) {
    child.abortFlagOf = fake::number(handleValue);
  }
  return ncclSuccess;
}

ncclResult_t RecordingNccl::commSplit(ncclComm_t handleValue, int color, int key,
                                      ncclComm_t* newcomm, ncclConfig_t* config) {
  const bool noColor = color == NCCL_SPLIT_NOCOLOR;
  const std::string call = "ncclCommSplit(" + commName(handleValue) +
                           ", color=" + (noColor ? "NOCOLOR" : std::to_string(color)) +
                           ", key=" + std::to_string(key) + configText(config) + ")";
  if (const std::string refusal = configRefusal(config); !refusal.empty()) {
    gpu_->log().add(call + " failed: NCCL refuses the config (" + refusal + ")");
    return ncclInvalidArgument;
  }
  if (color < 0 && !noColor) {
    gpu_->log().violation(call + ": a color must be non-negative or NCCL_SPLIT_NOCOLOR");
    return ncclInvalidArgument;
  }
  gpu_->bindDevice();
  std::unique_lock<std::mutex> lock(mutex_);
  Comm* parent = parentFor(handleValue, call);
  if (parent == nullptr) {
    return ncclInvalidArgument;
  }
  if (const ncclResult_t injected = outcome("ncclCommSplit"); injected != ncclSuccess) {
    gpu_->log().add(call + " failed");
    return injected;
  }
  *newcomm = nullptr;  // NCCL clears it first; only a made communicator is written there
  refuseOutstanding(*parent, call);
  const bool modelled = gpu_->models().split;
  const int nth = parent->splits++;
  const bool shares = parent->splitsShare;
  Comm::Shrinking making;
  making.into = newcomm;
  making.parent = fake::number(handleValue);
  making.sharesAbortFlag = shares;
  // The new one's own config is the split's, or else its parent's (then the environment).
  making.childShrinksShare = config != nullptr ? shrinksShareWith(config) : parent->shrinksShare;
  making.childSplitsShare = config != nullptr ? splitsShareWith(config) : parent->splitsShare;
  making.noColor = noColor;
  if (noColor) {
    gpu_->log().add(call + " -> none (this rank joins no new communicator)");
  } else {
    making.number = commsMade_++;  // named now, for the log
    gpu_->log().add(call + " -> " + commName(handle<ncclComm_t>(making.number)) +
                    (shares ? ", sharing its parent's resources" : ""));
  }
  if (!modelled) {  // the parent's members, made at once
    if (!noColor) {
      const uint64_t childKey = parent->key * 1000033 + static_cast<uint64_t>(nth) + 1;
      world_->join(childKey, parent->rank, parent->nranks, gpu_.get());
      *newcomm = handle<ncclComm_t>(making.number);
      made(making.number, parent->device, parent->nranks, parent->rank, childKey, false);
    }
    return ncclSuccess;
  }
  world_->joinSplit(parent->key, nth, parent->rank, parent->nranks, color, key);
  making.splitNth = nth;
  parent->shrinking = making;
  if (!noColor) {
    parent->childAbortFlag = making.number;
  }
  if (blocksWith(config)) {
    // NCCL's thread runs it to the end before the call returns.
    const auto deadline = std::chrono::steady_clock::now() + kBlockingInitWait;
    while (parent->shrinking) {
      if (placeSplit(*parent) && parent->shrinking && world_->complete(parent->shrinking->key)) {
        finishShrink(*parent, ncclSuccess);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        gpu_->log().add(call + " never met the other members");
        return ncclSystemError;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
    }
    return ncclSuccess;
  }
  return ncclInProgress;
}

RecordingNccl::Comm* RecordingNccl::parentFor(ncclComm_t handleValue, const std::string& call) {
  Comm* parent = usable(handleValue, call);
  if (parent == nullptr) {
    gpu_->log().add(call + " failed");
    return nullptr;
  }
  if (parent->device != FakeGpu::currentDevice()) {
    gpu_->log().violation(call + " on device " + std::to_string(FakeGpu::currentDevice()) +
                          ", not its communicator's " + std::to_string(parent->device));
  }
  return parent;
}

void RecordingNccl::refuseOutstanding(const Comm& parent, const std::string& call) {
  if ((gpu_->models().split || gpu_->models().shrink) &&
      gpu_->hasLaunches(parent.key, parent.rank)) {
    gpu_->log().violation(call + " while " + parent.name +
                          " has operations outstanding on the GPU (NCCL: there should be none, "
                          "or the split or shrink may deadlock)");
  }
}

bool RecordingNccl::placeSplit(Comm& parent) {
  Comm::Shrinking& making = *parent.shrinking;
  if (making.splitNth < 0) {
    return true;
  }
  const auto place = world_->splitPlace(parent.key, making.splitNth, parent.rank);
  if (!place) {
    return false;
  }
  making.splitNth = -1;
  if (making.noColor) {
    parent.shrinking.reset();  // its part is done; nothing is written
    return true;
  }
  making.key = place->key;
  making.rank = place->rank;
  making.nranks = place->nranks;
  world_->join(place->key, place->rank, place->nranks, gpu_.get());
  return true;
}

void RecordingNccl::finishShrink(Comm& parent, ncclResult_t failure) {
  const Comm::Shrinking shrinking = *std::exchange(parent.shrinking, std::nullopt);
  Comm& child = made(shrinking.number, parent.device, shrinking.nranks, shrinking.rank,
                     shrinking.key, /*blocking=*/false);
  // NCCL reports a new one whose making failed on the parent, as a sticky asynchronous error
  // (its group job's communicator); the new one's own state says nothing. One ended by the
  // parent's abort is unusable.
  child.asyncFailure = parent.aborted ? failure : ncclSuccess;
  if (failure != ncclSuccess && !parent.aborted) {
    parent.asyncFailure = failure;
  }
  child.shrinksShare = shrinking.childShrinksShare;
  child.splitsShare = shrinking.childSplitsShare;
  if (shrinking.sharesAbortFlag) {
    child.abortFlagOf = shrinking.parent;
  }
  if (failure == ncclSuccess) {
    parent.childAbortFlag = -1;  // made well: NCCL unlinks the parent from its abort flag
  } else {
    gpu_->log().add("making " + child.name + " from " + parent.name + " failed" +
                    (parent.aborted ? " (ended by the parent's abort)" : ""));
  }
  // NCCL's thread writes it with a release store when it is done.
  __atomic_store_n(shrinking.into, handle<ncclComm_t>(shrinking.number), __ATOMIC_RELEASE);
}

}  // namespace streamnccl::fake
