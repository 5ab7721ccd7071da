#pragma once

// Test-only. The memory of the fake GPUs: the process's CPU allocator, replaced while any fake
// GPU is alive by one that behaves like CUDA's stream-ordered caching allocator at its most
// hostile. Each block remembers the stream that was current when it was allocated (its
// owner); a freed block is handed to the next allocation of its size class on that stream at once,
// and poisoned when its stream gets to the free (work enqueued there before the free still
// sees the data, as on a GPU). On a GPU that reuse is safe only for work on the same stream,
// which is what the fake checks (FakeGpu): memory a kernel uses on another stream must still
// be held when the kernel runs.
//
// While a stream is captured into a CUDA graph its allocations come from the graph's private
// pool: reused only by allocations of the same pool, never given back, as PyTorch's graph
// pools are.

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace streamnccl::fake {

class FakeMemory final : public c10::Allocator {
 public:
  // The allocator, installed as the CPU allocator on first use; it passes every call through
  // to the allocator it replaced while no fake GPU is armed.
  static FakeMemory& instance();

  // Whose stream an allocation is ordered on: the fake GPU (by serial, 0: none, as for a
  // thread that never used one), its stream, and the graph pool (0: none) it comes from.
  struct Owner {
    uint64_t gpu = 0;
    int64_t stream = 0;
    uint64_t pool = 0;
    bool operator<(const Owner& other) const {
      return std::tie(gpu, stream, pool) < std::tie(other.gpu, other.stream, other.pool);
    }
    bool operator==(const Owner& other) const {
      return gpu == other.gpu && stream == other.stream && pool == other.pool;
    }
  };
  // The owner of the calling thread's allocations from now on (its current stream).
  static void setAllocationOwner(Owner owner);
  static Owner allocationOwner();

  // Allocations of the calling thread pass through untracked while one is alive (the fake's
  // own temporaries, made as its kernels run).
  class Untracked {
   public:
    Untracked();
    ~Untracked();
    Untracked(const Untracked&) = delete;
    Untracked& operator=(const Untracked&) = delete;

   private:
    const bool previous_;
  };

  // A fake GPU orders the poisoning of the blocks its streams own: `poisonLater` is called
  // (without the allocator's lock) with each freed block of GPU `gpu`, and the GPU calls
  // poisonIfStillFree() when the block's stream gets there. Between attach and detach
  // (counted), allocations are tracked.
  using PoisonLater = std::function<void(const Owner& owner, uint8_t* data, uint64_t generation)>;
  void attach(uint64_t gpu, PoisonLater poisonLater);
  void detach(uint64_t gpu);
  // Poisons the block at `data` if it is still free since the free of `generation` (a block
  // handed out again meanwhile belongs to its new owner).
  void poisonIfStillFree(uint8_t* data, uint64_t generation);

  // What the allocator knows of the memory at `pointer` now.
  struct Block {
    bool tracked = false;  // allocated while armed
    bool live = false;
    uint64_t generation = 0;  // changes whenever the block is freed or handed out again
    Owner owner;              // whose stream allocated it
    uintptr_t start = 0;      // where the block begins
    size_t size = 0;          // what its allocation asked for
  };
  Block lookup(const void* pointer) const;
  // How many blocks were handed out again after a free (a measure of the allocator's reuse).
  uint64_t reuses() const { return reuses_.load(); }
  // How many tracked blocks each thread (by name) has freed: dropping a tensor's last
  // reference frees it on that thread, which for the watchdog's must never happen.
  std::map<std::string, uint64_t> freesByThread() const;

  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  FakeMemory();
  static void release(void* context);
  void free(uint8_t* data);

  struct Record {
    size_t bytes = 0;      // the block's size class
    size_t requested = 0;  // what the allocation asked for
    bool live = false;
    uint64_t generation = 0;
    Owner owner;
  };

  c10::Allocator* const passthrough_;
  mutable std::mutex mutex_;
  std::map<uint64_t, PoisonLater> gpus_;
  std::map<std::string, uint64_t> freesByThread_;
  std::map<uintptr_t, Record> blocks_;  // by start address
  std::map<std::pair<Owner, size_t>, std::vector<uint8_t*>> released_;
  uint64_t generations_ = 0;
  std::atomic<int> armed_{0};
  std::atomic<uint64_t> reuses_{0};
};

}  // namespace streamnccl::fake
