#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

namespace streamnccl {

// Lets go of a group's Gloo backend, once its group broke, on a thread of its own: Gloo's
// destructor waits for the ops inside it (which end at Gloo's timeout, or once their peers close
// their connections), and from torch 2.14 a Backend holds its Python object, which the last
// reference lets go of with the GIL. Neither may hold up a thread of the group or the caller's.
void letGoOfGloo(c10::intrusive_ptr<c10d::Backend> gloo);

// The Gloo backend under a group's host path, made at the group's first CPU op rather than
// with the group: a group used only for CUDA tensors never opens Gloo's sockets and threads.
//
// Its devices connect two ranks at their first exchange (Gloo's lazy_init), and a rank can
// connect to a peer only once the peer has opened its Gloo (its address is in the Store). Gloo
// waits for that address holding its context's lock, which would stall the group's other
// exchanges on this rank meanwhile (a recv from a peer that is there, behind a send to one
// that is not yet). So every op first waits, holding nothing, until the ranks it exchanges
// with have opened theirs (awaitOpen), as the eager full mesh at the group's making ensured.
// get() takes the GIL (through the callable) while it holds this object's lock: call it only
// without the GIL, as every op does (torch's bindings release it).
class LazyGloo {
 public:
  // Makes a group's Gloo backend, meeting its other members in `store`. python/streamnccl
  // passes one that takes the GIL.
  using Open = std::function<c10::intrusive_ptr<c10d::Backend>(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      std::chrono::milliseconds timeout)>;

  // One made already, by every member (the tests' and the simulated device's).
  static std::shared_ptr<LazyGloo> of(c10::intrusive_ptr<c10d::Backend> gloo);
  // One `open` makes at the first get(), meeting under `store`'s Gloo prefix.
  static std::shared_ptr<LazyGloo> deferred(Open open, const c10::intrusive_ptr<c10d::Store>& store,
                                            int rank, int size, std::chrono::milliseconds timeout);

  // Lets go of the backend on a thread of its own where this is a group's thread (Gloo's
  // among them: see HostCommunicator).
  ~LazyGloo();
  LazyGloo() = default;
  LazyGloo(const LazyGloo&) = delete;
  LazyGloo& operator=(const LazyGloo&) = delete;

  // The backend, made by the first call. A failure to make it raises a DistBackendError with
  // the cause (the group then breaks, as at a failed NCCL init).
  c10::intrusive_ptr<c10d::Backend> get();
  // Lets go of the backend (its communicators let go of theirs as they are aborted): once the
  // last goes, Gloo closes its connections, and a peer waiting in an exchange with this rank
  // learns at once that it is over, rather than at its timeout. Later get()s raise. Never
  // waits for a get() under way (which may wait for the GIL): that one lets go as it returns.
  void close();
  // Returns once `peer` (every other member, when nullopt) has opened its Gloo; raises a
  // DistBackendError after the group's timeout, or once `aborted()` says so.
  void awaitOpen(std::optional<int> peer, const std::function<bool()>& aborted);
  // Whether `peer` (every member, when nullopt) has opened its Gloo, asked of the Store once.
  bool isOpen(std::optional<int> peer);
  // Whether it is known to have, from an earlier ask: a look that never waits.
  bool knownOpen(std::optional<int> peer) const {
    return allSeenOpen_.load(std::memory_order_acquire) ||
           (peer && seenOpen_[*peer].load(std::memory_order_acquire));
  }
  // The group's timeout from now, and the DistBackendError naming who has not opened theirs
  // once it has passed.
  std::chrono::steady_clock::time_point deadlineFromNow() const;
  void raiseIfPast(std::chrono::steady_clock::time_point deadline, std::optional<int> peer);
  // The subgroup of `ranks` (this group's, this rank among them), meeting in `store`, with
  // `timeout`: made afresh by `open` when deferred, at its own first use; else Gloo's own
  // split, now.
  std::shared_ptr<LazyGloo> split(const c10::intrusive_ptr<c10d::Store>& store,
                                  const std::vector<int>& ranks, std::chrono::milliseconds timeout);

 private:
  std::string openedKey(int rank) const;

  int rank_ = 0;
  int size_ = 0;
  std::chrono::milliseconds timeout_{0};
  Open open_;  // empty for one made already
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::atomic<bool> closed_{false};
  // Which members are known to have opened theirs (all, for one made already).
  std::unique_ptr<std::atomic<bool>[]> seenOpen_;
  std::atomic<bool> allSeenOpen_{false};
};

}  // namespace streamnccl
