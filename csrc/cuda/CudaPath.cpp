#include "cuda/CudaPath.hpp"

#include "core/Errors.hpp"
#include "core/StoreKeys.hpp"
#include "core/SubgroupAgreement.hpp"
#include "cuda/CudaDevice.hpp"
#include "cuda/NcclCommunicator.hpp"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <map>
#include <set>
#include <thread>

namespace streamnccl {
namespace {

std::string rankName(int rank, int size, const c10::Device& device) {
  return "[streamnccl rank " + std::to_string(rank) + "/" + std::to_string(size) + " " +
         device.str();
}

// A group's opened communicators by key (NcclCommunicator::key(), the same on every rank).
using OpenedByKey =
    std::map<std::string, std::pair<c10::Device, std::shared_ptr<NcclCommunicator>>>;

OpenedByKey byKeyOf(const std::vector<std::pair<c10::Device, Path*>>& opened) {
  OpenedByKey byKey;
  for (const auto& [device, path] : opened) {
    auto communicator = std::dynamic_pointer_cast<NcclCommunicator>(path->communicator);
    TORCH_INTERNAL_ASSERT(communicator, "streamnccl: a CUDA path without an NCCL communicator");
    std::string key = communicator->key();
    byKey.emplace(std::move(key), std::make_pair(device, std::move(communicator)));
  }
  return byKey;
}

// The keys of those that are still live here (NcclCommunicator::live).
std::set<std::string> liveOf(const OpenedByKey& byKey) {
  std::set<std::string> live;
  for (const auto& [key, opened] : byKey) {
    if (opened.second->live()) {
      live.insert(key);
    }
  }
  return live;
}

}  // namespace

CudaPathFactory::CudaPathFactory(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda,
                                 c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                 c10::intrusive_ptr<Options> options)
    : nccl_(std::move(nccl)),
      cuda_(std::move(cuda)),
      store_(std::move(store)),
      rank_(rank),
      size_(size),
      options_(std::move(options)) {}

std::optional<std::string> CudaPathFactory::whyNoDevice() {
  try {
    cuda_->checkUsable(c10::Device(c10::kCUDA, 0));  // a process with any GPU has this one
    return std::nullopt;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
}

std::unique_ptr<Path> CudaPathFactory::open(const c10::Device& device) {
  cuda_->checkUsable(device);
  int number = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    number = communicatorsOpened_++;
  }
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<CudaDevice>(cuda_, device, options_->useHighPriorityStreams());
  path->communicator =
      std::make_shared<NcclCommunicator>(nccl_, cuda_, store_, rank_, size_, device,
                                         NcclMembership{{},
                                                        keys::ncclUniqueId(number),
                                                        rankName(rank_, size_, device) + "]",
                                                        options_->group_name},
                                         options_->timeout, options_->ncclConfig);
  return path;
}

PeerLanes CudaPathFactory::openPeer(const c10::Device& requested, int peer) {
  cuda_->checkUsable(requested);
  const int low = std::min(rank_, peer);
  const int high = std::max(rank_, peer);
  int number = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    number = lanesOpened_[peer]++;
  }
  const std::string pair = keys::lanePair(low, high, number);
  // Each lane connects in the background; until it has, its stream's work waits in a gate, so
  // that this rank's first message to a peer never waits for that peer's own first contact.
  // With one hardware queue the two lanes share one gate, opened once both have connected:
  // their held-back ops then reach the queue in program order, as the peer's do, and not in
  // the order the connections happened to finish (which could wait in a circle).
  const bool oneQueue = options_->hasSingleHardwareQueue();
  auto sharedGate = std::make_shared<StreamGate>();
  auto connecting = std::make_shared<std::atomic<int>>(2);
  auto lane = [&](int from, int to) {
    auto device =
        std::make_shared<CudaDevice>(cuda_, requested, options_->useHighPriorityStreams());
    auto communicator = std::make_shared<NcclCommunicator>(
        nccl_, cuda_, store_, rank_, size_, requested,
        NcclMembership{{from, to},
                       pair + "/" + std::to_string(from) + "-to-" + std::to_string(to),
                       rankName(rank_, size_, requested) + " lane " + std::to_string(from) + "->" +
                           std::to_string(to) + "]",
                       options_->group_name.empty()
                           ? ""
                           : options_->group_name + " lane " + std::to_string(from) + "->" +
                                 std::to_string(to)},
        options_->timeout, options_->ncclConfig);
    auto gate = oneQueue ? sharedGate : std::make_shared<StreamGate>();
    device->gateInternalStream(gate);
    communicator->whenConnected([gate, connecting, oneQueue] {
      if (!oneQueue || connecting->fetch_sub(1) == 1) {
        gate->open();
      }
    });
    auto path = std::make_unique<Path>();
    path->device = std::move(device);
    path->communicator = std::move(communicator);
    path->description = "lane " + std::to_string(from) + "->" + std::to_string(to);
    if (oneQueue) {
      path->description +=
          ", which shares the device's one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) "
          "with every other stream, so it runs only in turn: a send and a recv that must "
          "progress together need batch_isend_irecv";
    }
    return path;
  };
  auto lowToHigh = lane(low, high);
  auto highToLow = lane(high, low);
  if (rank_ == low) {
    return {std::move(lowToHigh), std::move(highToLow)};
  }
  return {std::move(highToLow), std::move(lowToHigh)};
}

std::unique_ptr<Path> CudaPathFactory::openAnySource(const c10::Device& /*device*/) {
  TORCH_CHECK(false, "NCCL cannot receive from any source; name the sender (`src`)");
}

std::unique_ptr<PathFactory> CudaPathFactory::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const std::vector<int>& ranks,
                                                    const c10::intrusive_ptr<Options>& options) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  TORCH_INTERNAL_ASSERT(me != ranks.end(), "streamnccl: split without this rank");
  auto own = c10::make_intrusive<Options>(*options);
  // Its communicators are named after the subgroup, or else as part of this group's (when
  // torch names the subgroup only later).
  if (own->group_name.empty() || own->group_name == options_->group_name) {
    own->group_name = options_->group_name.empty() ? "" : options_->group_name + " subgroup";
  }
  return std::make_unique<CudaPathFactory>(nccl_, cuda_, store,
                                           static_cast<int>(me - ranks.begin()),
                                           static_cast<int>(ranks.size()), std::move(own));
}

std::vector<std::pair<c10::Device, std::unique_ptr<Path>>> CudaPathFactory::childPaths(
    const std::vector<std::pair<c10::Device, Path*>>& opened, c10d::Store& store, int rank,
    int ranks, std::chrono::milliseconds timeout, const Options& options, const char* what,
    const MakeChild& child) {
  std::vector<std::pair<c10::Device, std::unique_ptr<Path>>> paths;
  const OpenedByKey byKey = byKeyOf(opened);
  // Every rank opened the same paths, at the same ops: none here is none anywhere, and there
  // is nothing to agree on (for a shrink, the Store may be gone with the rank that hosted it).
  if (byKey.empty()) {
    return paths;
  }
  const std::set<std::string> live =
      agreement::liveOnEveryRank(store, rank, ranks, liveOf(byKey), timeout, what);
  for (const std::string& key : live) {  // in key order, the same on every rank
    const auto& [device, parent] = byKey.at(key);
    auto path = std::make_unique<Path>();
    path->device = std::make_shared<CudaDevice>(cuda_, device, options.useHighPriorityStreams());
    path->communicator = child(*parent, device);
    paths.emplace_back(device, std::move(path));
  }
  return paths;
}

PathFactory::Subgroup CudaPathFactory::splitSubgroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<Options>& options,
                                                     const SplitMeeting& of) {
  Subgroup subgroup{split(store, ranks, options), {}};
  if (!of.store) {
    return subgroup;  // nothing to agree through: it connects afresh at its first op
  }
  const int newRank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  const int newSize = static_cast<int>(ranks.size());
  // The subgroups of one split do not overlap, so their lowest ranks tell them apart.
  const int color = ranks.front();
  const std::string tag = "split-" + std::to_string(color) + "-of-" + std::to_string(newSize);
  subgroup.paths = childPaths(
      of.opened, *of.store, of.rank, of.size, of.timeout, *options, "split",
      [&](const NcclCommunicator& parent, const c10::Device& device) {
        return parent.split(color, newRank, newSize, rankName(newRank, newSize, device) + "]", tag,
                            options->timeout, options->ncclConfig, of.store);
      });
  return subgroup;
}

void CudaPathFactory::splitWithout(const SplitMeeting& of) {
  const OpenedByKey byKey = byKeyOf(of.opened);
  if (!of.store || byKey.empty()) {
    return;
  }
  const std::set<std::string> toSplit =
      agreement::liveOnEveryRank(*of.store, of.rank, of.size, liveOf(byKey), of.timeout, "split");
  for (const std::string& key : toSplit) {
    byKey.at(key).second->splitWithoutColor(of.timeout, of.store);
  }
}

PathFactory::Subgroup CudaPathFactory::shrink(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& survivors,
    const std::vector<int>& excluded, const std::vector<std::pair<c10::Device, Path*>>& opened,
    bool abortInFlight, const c10::intrusive_ptr<Options>& options) {
  const int newRank =
      static_cast<int>(std::find(survivors.begin(), survivors.end(), rank_) - survivors.begin());
  const int newSize = static_cast<int>(survivors.size());
  Subgroup shrunk{split(store, survivors, options), {}};
  // Only the survivors take part; those not live on all of them connect afresh when first used.
  shrunk.paths = childPaths(
      opened, *store, newRank, newSize, options->timeout, *options, "shrink",
      [&](const NcclCommunicator& parent, const c10::Device& device) {
        int version = 0;
        TORCH_CHECK(nccl_->getVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 27, 0),
                    "streamnccl: shrink_group needs NCCL 2.27 or newer (ncclCommShrink); this "
                    "process loaded NCCL ",
                    version / 10000, ".", version % 10000 / 100, ".", version % 100);
        return parent.shrunk(excluded, abortInFlight, newRank, newSize,
                             rankName(newRank, newSize, device) + "]", options->timeout,
                             options->ncclConfig, store);
      });
  return shrunk;
}

}  // namespace streamnccl
