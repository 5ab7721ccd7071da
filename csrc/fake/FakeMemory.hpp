#pragma once

// Test-only. The memory of the fake GPUs: the process's CPU allocator, replaced while any fake
// GPU is alive by one that behaves like CUDA's stream-ordered caching allocator at its most
// hostile. Each block remembers the stream that was current when it was allocated; a freed
// block is poisoned and handed to the next allocation of its size on that stream at once.
// On a GPU that reuse is safe only for work on the same stream, which is what the fakes check
// (FakeGpu): memory an NCCL call reads on another stream, or inside a group before
// ncclGroupEnd, must still be held when the call runs.

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace streamnccl::fake {

class FakeMemory final : public c10::Allocator {
 public:
  // The allocator, installed as the CPU allocator on first use; it passes every call through
  // to the allocator it replaced while no fake GPU is armed.
  static FakeMemory& instance();

  // Between arm() and disarm() (counted), allocations are tracked, poisoned and reused.
  void arm();
  void disarm();

  // What the allocator knows of the memory at `pointer` now.
  struct Block {
    bool tracked = false;  // allocated while armed
    bool live = false;
    uint64_t generation = 0;  // changes whenever the block is freed or handed out again
    int64_t stream = 0;       // the stream current when it was allocated
  };
  Block lookup(const void* pointer) const;

  // The stream new allocations of the calling thread are tagged with (its current stream).
  static void setAllocationStream(int64_t stream);

  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  FakeMemory();
  static void release(void* context);
  void free(uint8_t* data);

  struct Record {
    size_t bytes = 0;
    bool live = false;
    uint64_t generation = 0;
    int64_t stream = 0;
  };

  c10::Allocator* const passthrough_;
  std::atomic<int> armed_{0};
  mutable std::mutex mutex_;
  std::map<uintptr_t, Record> blocks_;  // by start address
  std::map<std::pair<int64_t, size_t>, std::vector<uint8_t*>> released_;
  uint64_t generations_ = 0;
};

}  // namespace streamnccl::fake
