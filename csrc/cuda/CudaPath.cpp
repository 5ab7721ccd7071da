#include "cuda/CudaPath.hpp"

#include "cuda/CudaDevice.hpp"
#include "cuda/NcclCommunicator.hpp"

#include <algorithm>
#include <atomic>

namespace streamnccl {
namespace {

std::string rankName(int rank, int size, const c10::Device& device) {
  return "[streamnccl rank " + std::to_string(rank) + "/" + std::to_string(size) + " " +
         device.str();
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

std::unique_ptr<Path> CudaPathFactory::open(const c10::Device& device) {
  cuda_->checkUsable(device);
  int number = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    number = communicatorsOpened_++;
  }
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<CudaDevice>(cuda_, device, options_->useHighPriorityStreams());
  path->communicator = std::make_shared<NcclCommunicator>(
      nccl_, cuda_, store_, rank_, size_, device,
      NcclMembership{{},
                     "streamnccl/ncclUniqueId/" + std::to_string(number),
                     rankName(rank_, size_, device) + "]"},
      options_->timeout);
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
  const std::string pair = "streamnccl/p2p/" + std::to_string(low) + "-" + std::to_string(high) +
                           "/" + std::to_string(number);
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
                           std::to_string(to) + "]"},
        options_->timeout);
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
                                                    const std::vector<int>& ranks) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  TORCH_INTERNAL_ASSERT(me != ranks.end(), "streamnccl: split without this rank");
  return std::make_unique<CudaPathFactory>(nccl_, cuda_, store,
                                           static_cast<int>(me - ranks.begin()),
                                           static_cast<int>(ranks.size()), options_);
}

}  // namespace streamnccl
