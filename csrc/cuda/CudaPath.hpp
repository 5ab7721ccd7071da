#pragma once

#include "core/Options.hpp"
#include "core/Path.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>

namespace streamnccl {

// Opens the NCCL path for one CUDA device: a CudaDevice and that device's NCCL communicator.
class CudaPathFactory final : public PathFactory {
 public:
  CudaPathFactory(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                  c10::intrusive_ptr<Options> options);
  std::unique_ptr<Path> open(const c10::Device& device) override;

 private:
  const c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int size_;
  const c10::intrusive_ptr<Options> options_;
  // Ranks open their devices in the same op order, so the n-th communicator of each rank
  // shares the n-th unique id, whatever device index each rank uses.
  int communicatorsOpened_ = 0;
};

}  // namespace streamnccl
