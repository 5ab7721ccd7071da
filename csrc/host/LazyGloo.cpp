#include "host/LazyGloo.hpp"

#include "core/Errors.hpp"

#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <thread>

namespace streamnccl {
namespace {

// Where a group's Gloo meets, under the group's store: apart from streamnccl's own keys.
constexpr const char* kGlooStorePrefix = "streamnccl/gloo/";

}  // namespace

std::shared_ptr<LazyGloo> LazyGloo::of(c10::intrusive_ptr<c10d::Backend> gloo) {
  auto lazy = std::make_shared<LazyGloo>();
  lazy->rank_ = gloo->getRank();
  lazy->size_ = gloo->getSize();
  lazy->gloo_ = std::move(gloo);
  lazy->allSeenOpen_ = true;
  return lazy;
}

std::shared_ptr<LazyGloo> LazyGloo::deferred(Open open,
                                             const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                             int size, std::chrono::milliseconds timeout) {
  auto lazy = std::make_shared<LazyGloo>();
  lazy->rank_ = rank;
  lazy->size_ = size;
  lazy->timeout_ = timeout;
  lazy->open_ = std::move(open);
  lazy->store_ = c10::make_intrusive<c10d::PrefixStore>(kGlooStorePrefix, store);
  lazy->seenOpen_ = std::make_unique<std::atomic<bool>[]>(size);
  for (int member = 0; member < size; ++member) {
    lazy->seenOpen_[member] = member == rank;
  }
  return lazy;
}

std::string LazyGloo::openedKey(int rank) const {
  return "streamnccl-opened/" + std::to_string(rank);
}

c10::intrusive_ptr<c10d::Backend> LazyGloo::get() {
  // Held while making: every path of the group waits for the one Gloo.
  std::lock_guard<std::mutex> lock(mutex_);
  if (!gloo_) {
    c10::intrusive_ptr<c10d::Backend> made;
    try {
      made = open_(store_, rank_, size_, timeout_);
    } catch (const std::exception& e) {
      throwDistBackendError(std::string("opening Gloo for the host path failed: ") + e.what());
    }
    if (!made || made->getRank() != rank_ || made->getSize() != size_) {
      throwDistBackendError("opening Gloo for the host path made no backend of rank " +
                            std::to_string(rank_) + " of " + std::to_string(size_));
    }
    // Gloo has put this rank's address in the store: the others may now connect to it.
    store_->set(openedKey(rank_), std::vector<uint8_t>{1});
    gloo_ = std::move(made);
  }
  return gloo_;
}

void LazyGloo::awaitOpen(std::optional<int> peer, const std::function<bool()>& aborted) {
  if (allSeenOpen_.load(std::memory_order_acquire)) {
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto pause = std::chrono::microseconds(200);
  bool all = true;
  for (int member = 0; member < size_; ++member) {
    if (seenOpen_[member].load(std::memory_order_acquire)) {
      continue;
    }
    if (peer && member != *peer) {
      all = false;
      continue;
    }
    // Polled rather than a blocking wait, so that abort() and the deadline end it.
    while (!store_->check({openedKey(member)})) {
      if (aborted()) {
        throwDistBackendError("the host communicator was aborted");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throwDistBackendError("rank " + std::to_string(member) +
                              " did not open the group's host path (its first CPU op on the "
                              "group) within " +
                              std::to_string(timeout_.count()) + " ms");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
    seenOpen_[member].store(true, std::memory_order_release);
  }
  if (all) {
    allSeenOpen_.store(true, std::memory_order_release);
  }
}

std::shared_ptr<LazyGloo> LazyGloo::split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          std::chrono::milliseconds timeout) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  TORCH_INTERNAL_ASSERT(me != ranks.end(), "streamnccl: a Gloo split without this rank");
  if (open_) {
    // Afresh, with devices of its own: Gloo's split shares the parent's devices, on which two
    // contexts' lazily connected pairs cannot be told apart.
    return deferred(open_, store, static_cast<int>(me - ranks.begin()),
                    static_cast<int>(ranks.size()), timeout);
  }
  const auto gloo = get();
  auto glooStore = c10::make_intrusive<c10d::PrefixStore>(kGlooStorePrefix, store);
  auto subgroup = gloo->split(glooStore, ranks, gloo->getBackendOptions());
  TORCH_CHECK(subgroup, "streamnccl: Gloo did not split for ranks ", c10::Join(", ", ranks));
  return of(std::move(subgroup));
}

}  // namespace streamnccl
