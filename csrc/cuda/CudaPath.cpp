#include "cuda/CudaPath.hpp"

#include "cuda/CudaDevice.hpp"
#include "cuda/NcclCommunicator.hpp"

#include <c10/cuda/CUDAFunctions.h>

namespace streamnccl {

CudaPathFactory::CudaPathFactory(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                 c10::intrusive_ptr<Options> options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {}

std::unique_ptr<Path> CudaPathFactory::open(const c10::Device& device) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "expected an indexed cuda device, got ",
              device);
  const auto visible = c10::cuda::device_count();
  TORCH_CHECK(visible > 0, "this process sees no CUDA device (no GPU or driver present)");
  TORCH_CHECK(device.index() < visible, "this process sees ", static_cast<int>(visible),
              " CUDA device(s), so ", device, " does not exist");
  auto path = std::make_unique<Path>();
  path->device = std::make_shared<CudaDevice>(device, options_->useHighPriorityStreams());
  path->communicator =
      std::make_shared<NcclCommunicator>(*store_, rank_, size_, device, communicatorsOpened_++);
  return path;
}

}  // namespace streamnccl
