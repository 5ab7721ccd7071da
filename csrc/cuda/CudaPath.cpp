#include "cuda/CudaPath.hpp"

#include "cuda/CudaDevice.hpp"
#include "cuda/NcclCommunicator.hpp"

#include <c10/cuda/CUDAFunctions.h>

namespace streamnccl {
namespace {

void checkUsable(const c10::Device& device) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "expected an indexed cuda device, got ",
              device);
  const auto visible = c10::cuda::device_count();
  TORCH_CHECK(visible > 0, "this process sees no CUDA device (no GPU or driver present)");
  TORCH_CHECK(device.index() < visible, "this process sees ", static_cast<int>(visible),
              " CUDA device(s), so ", device, " does not exist");
}

std::string rankName(int rank, int size, const c10::Device& device) {
  return "[streamnccl rank " + std::to_string(rank) + "/" + std::to_string(size) + " " +
         device.str();
}

}  // namespace

CudaPathFactory::CudaPathFactory(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                 c10::intrusive_ptr<Options> options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {}

std::unique_ptr<Path> CudaPathFactory::open(const c10::Device& device) {
  checkUsable(device);
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<CudaDevice>(device, options_->useHighPriorityStreams());
  path->communicator = std::make_shared<NcclCommunicator>(
      *store_, rank_, size_, device,
      NcclMembership{{},
                     "streamnccl/ncclUniqueId/" + std::to_string(communicatorsOpened_++),
                     rankName(rank_, size_, device) + "]"});
  return path;
}

PeerLanes CudaPathFactory::openPeer(const c10::Device& device, int peer) {
  checkUsable(device);
  const int low = std::min(rank_, peer);
  const int high = std::max(rank_, peer);
  const std::string pair = "streamnccl/p2p/" + std::to_string(low) + "-" + std::to_string(high) +
                           "/" + std::to_string(lanesOpened_[peer]++);
  // Both ranks open the low-to-high direction first: each init waits for the other rank.
  auto lane = [&](int from, int to) {
    auto path = std::make_unique<Path>();
    path->device = std::make_shared<CudaDevice>(device, options_->useHighPriorityStreams());
    path->communicator = std::make_shared<NcclCommunicator>(
        *store_, rank_, size_, device,
        NcclMembership{{from, to},
                       pair + "/" + std::to_string(from) + "-to-" + std::to_string(to),
                       rankName(rank_, size_, device) + " lane " + std::to_string(from) + "->" +
                           std::to_string(to) + "]"});
    return path;
  };
  auto lowToHigh = lane(low, high);
  auto highToLow = lane(high, low);
  if (rank_ == low) {
    return {std::move(lowToHigh), std::move(highToLow)};
  }
  return {std::move(highToLow), std::move(lowToHigh)};
}

}  // namespace streamnccl
