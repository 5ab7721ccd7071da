#include "host/LazyGloo.hpp"

#include "core/Backoff.hpp"
#include "core/Errors.hpp"
#include "core/GroupThreads.hpp"
#include "core/StoreKeys.hpp"

#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <c10/util/thread_name.h>

#include <algorithm>
#include <system_error>
#include <thread>

namespace streamnccl {
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
  lazy->store_ = c10::make_intrusive<c10d::PrefixStore>(keys::gloo(), store);
  lazy->seenOpen_ = std::make_unique<std::atomic<bool>[]>(size);
  for (int member = 0; member < size; ++member) {
    lazy->seenOpen_[member] = member == rank;
  }
  return lazy;
}

std::string LazyGloo::openedKey(int rank) const {
  return "streamnccl-opened/" + std::to_string(rank);
}

void letGoOfGloo(c10::intrusive_ptr<c10d::Backend> gloo) {
  if (!gloo) {
    return;
  }
  try {
    std::thread([gloo = std::move(gloo)]() mutable {
      c10::setThreadName("streamnccl-gloo");
      gloo.reset();
    }).detach();
  } catch (const std::system_error&) {
    // No thread to be had: the reference goes here, with the wait it may bring.
  }
}

LazyGloo::~LazyGloo() {
  if (onGroupThread()) {
    letGoOfGloo(std::move(gloo_));
  }
}

void LazyGloo::close() {
  closed_.store(true);
  c10::intrusive_ptr<c10d::Backend> released;  // let go of after the lock
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock()) {
    released = std::move(gloo_);
  }
  lock.unlock();
  letGoOfGloo(std::move(released));
}

c10::intrusive_ptr<c10d::Backend> LazyGloo::get() {
  if (closed_.load()) {
    throwDistBackendError("the host path was closed (its group broke)");
  }
  // Held while making: every path of the group waits for the one Gloo.
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_.load()) {  // while this waited: not made again
    throwDistBackendError("the host path was closed (its group broke)");
  }
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
  if (closed_.load()) {  // while this made it: the caller's is the last reference
    return std::exchange(gloo_, {});
  }
  return gloo_;
}

bool LazyGloo::isOpen(std::optional<int> peer) {
  if (knownOpen(peer)) {
    return true;
  }
  std::vector<int> unseen;
  for (int member = 0; member < size_; ++member) {
    if ((!peer || member == *peer) && !seenOpen_[member].load(std::memory_order_acquire)) {
      unseen.push_back(member);
    }
  }
  if (unseen.empty()) {
    allSeenOpen_.store(true, std::memory_order_release);
    return true;
  }
  std::vector<std::string> keys;
  for (const int member : unseen) {
    keys.push_back(openedKey(member));
  }
  if (!store_->check(keys)) {  // one round trip for all of them
    return false;
  }
  for (const int member : unseen) {
    seenOpen_[member].store(true, std::memory_order_release);
  }
  bool all = true;  // the last member seen, one peer at a time, makes it all of them
  for (int member = 0; member < size_ && all; ++member) {
    all = seenOpen_[member].load(std::memory_order_acquire);
  }
  if (all) {
    allSeenOpen_.store(true, std::memory_order_release);
  }
  return true;
}

std::chrono::steady_clock::time_point LazyGloo::deadlineFromNow() const {
  const auto now = std::chrono::steady_clock::now();
  const auto left = std::chrono::steady_clock::time_point::max() - now;
  return timeout_ < left ? now + timeout_ : std::chrono::steady_clock::time_point::max();
}

void LazyGloo::raiseIfPast(std::chrono::steady_clock::time_point deadline,
                           std::optional<int> peer) {
  if (std::chrono::steady_clock::now() <= deadline) {
    return;
  }
  std::string missing;
  for (int member = 0; member < size_; ++member) {
    if ((!peer || member == *peer) && !store_->check({openedKey(member)})) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(member);
    }
  }
  throwDistBackendError("rank(s) " + missing +
                        " did not open the group's host path (their first CPU op on the group) "
                        "within " +
                        std::to_string(timeout_.count()) + " ms");
}

void LazyGloo::awaitOpen(std::optional<int> peer, const std::function<bool()>& aborted) {
  if (isOpen(peer)) {
    return;
  }
  const auto deadline = deadlineFromNow();
  Backoff backoff(std::chrono::microseconds(200), std::chrono::microseconds(20000));
  // Polled rather than a blocking wait, so that abort() and the deadline end it.
  while (!isOpen(peer)) {
    if (aborted()) {
      throwDistBackendError("the host communicator was aborted");
    }
    raiseIfPast(deadline, peer);
    backoff.pause();
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
  auto glooStore = c10::make_intrusive<c10d::PrefixStore>(keys::gloo(), store);
  auto subgroup = gloo->split(glooStore, ranks, gloo->getBackendOptions());
  TORCH_CHECK(subgroup, "streamnccl: Gloo did not split for ranks ", c10::Join(", ", ranks));
  return of(std::move(subgroup));
}

}  // namespace streamnccl
