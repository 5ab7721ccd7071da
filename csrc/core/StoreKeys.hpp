#pragma once

// Every prefix and key streamnccl writes under in a group's c10d::Store, in one place. All
// start with "streamnccl/"; the keys inside a prefix belong to the unit that writes there
// (BreakBoard's first post and answers, a split's "failed", a monitored barrier's arrivals, the
// host path's "streamnccl-opened/<rank>" beside Gloo's own keys). Under a group's store:
//
//   attempt/<n>/                   a torchelastic restart's own keys (storeOfThisAttempt)
//   gloo/                          the host path's Gloo meets here
//   ncclUniqueId/<n>               the n-th NCCL communicator the group opened
//   p2p/<low>-<high>/<n>/...       the n-th lane pair between two ranks
//   split/<name>/                  a subgroup's agreement (new_group, split_group; PrefixStore
//                                  adds the last "/")
//   shrink/<n>/<excluded>/         the n-th shrink, leaving out the ranks named
//   verdict, arrived, live/<key>   inside a split's or shrink's prefix: whether it goes ahead
//   breaks/<size>/...              error propagation (BreakBoard)
//   barrier_place/<device type>/   where a barrier naming a device runs
//   monitored_barrier/<n>/         the n-th monitored_barrier
//   debug/<n>/                     the n-th collective checked by the debug same-op check

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace streamnccl::keys {

// A view, not a std::string: nothing to destroy, so a key may still be made at exit.
inline constexpr std::string_view kRoot = "streamnccl/";

inline std::string gloo() { return std::string(kRoot) + "gloo/"; }
inline std::string ncclUniqueId(int n) {
  return std::string(kRoot) + "ncclUniqueId/" + std::to_string(n);
}
inline std::string lanePair(int low, int high, int n) {
  return std::string(kRoot) + "p2p/" + std::to_string(low) + "-" + std::to_string(high) + "/" +
         std::to_string(n);
}
inline std::string split(const std::string& name) { return std::string(kRoot) + "split/" + name; }
inline std::string shrink(int n, const std::string& excluded) {
  return std::string(kRoot) + "shrink/" + std::to_string(n) + "/" + excluded + "/";
}
inline std::string splitVerdict() { return std::string(kRoot) + "verdict"; }
inline std::string splitArrived() { return std::string(kRoot) + "arrived"; }
inline std::string splitLive(const std::string& key) { return std::string(kRoot) + "live/" + key; }
inline std::string breaks() { return std::string(kRoot) + "breaks/"; }
inline std::string barrierPlace(const std::string& deviceType) {
  return std::string(kRoot) + "barrier_place/" + deviceType + "/";
}
inline std::string monitoredBarrier(int n) {
  return std::string(kRoot) + "monitored_barrier/" + std::to_string(n) + "/";
}
inline std::string debugCheck(uint64_t n) {
  return std::string(kRoot) + "debug/" + std::to_string(n) + "/";
}

// `store` as a restarted torchelastic worker must use it: its attempt's keys apart from those of
// the attempt before it, still in the same store (the dead workers' Gloo addresses, NCCL unique
// ids). `store` itself outside torchelastic. python/streamnccl makes every group's with it.
c10::intrusive_ptr<c10d::Store> storeOfThisAttempt(const c10::intrusive_ptr<c10d::Store>& store);

}  // namespace streamnccl::keys
