#include "sim/SimMemory.hpp"

#include <ATen/ATen.h>

#include <limits>

namespace streamnccl::sim {

SimMemory::SimMemory() : pool_(std::make_shared<Pool>()) {}

at::Tensor SimMemory::empty(int64_t numel) {
  float* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_->mutex);
    auto& released = pool_->released[numel];
    if (!released.empty()) {
      block = released.back();  // most recently released first, as a caching allocator does
      released.pop_back();
      ++pool_->reuses;
    } else {
      pool_->blocks.push_back(std::make_unique<float[]>(std::max<int64_t>(numel, 1)));
      block = pool_->blocks.back().get();
    }
  }
  auto release = [pool = pool_, numel](void* data) {
    auto* floats = static_cast<float*>(data);
    std::fill(floats, floats + numel, std::numeric_limits<float>::quiet_NaN());
    std::lock_guard<std::mutex> lock(pool->mutex);
    pool->released[numel].push_back(floats);
  };
  return at::from_blob(block, {numel}, release, at::TensorOptions().dtype(at::kFloat));
}

int64_t SimMemory::reuses() const {
  std::lock_guard<std::mutex> lock(pool_->mutex);
  return pool_->reuses;
}

}  // namespace streamnccl::sim
