#pragma once

// Test-only. Float tensors from a pool that behaves like a caching allocator at its most
// hostile: memory is poisoned (NaN) the moment its last reference goes, and the next tensor
// of that size gets the same memory back. An op that still used such memory would read NaN
// or write into someone else's tensor.

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace streamnccl::sim {

class SimMemory {
 public:
  SimMemory();
  at::Tensor empty(int64_t numel);
  // How many tensors were given memory that an earlier tensor had released.
  int64_t reuses() const;

 private:
  struct Pool {
    std::mutex mutex;
    std::vector<std::unique_ptr<float[]>> blocks;  // owns every block, released or not
    std::map<int64_t, std::vector<float*>> released;
    int64_t reuses = 0;
  };
  const std::shared_ptr<Pool> pool_;
};

}  // namespace streamnccl::sim
