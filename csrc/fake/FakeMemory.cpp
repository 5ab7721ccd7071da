#include "fake/FakeMemory.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <cstdlib>
#include <cstring>

namespace streamnccl::fake {
namespace {

constexpr size_t kAlignment = 64;  // as c10's CPU allocator
// CUDA's caching allocator rounds small blocks up to 512 bytes and hands a freed block to any
// request of its size class, not only one of its exact size: so does this one.
constexpr size_t kSizeClass = 512;
constexpr size_t kReleasedPerSize = 64;  // blocks kept for reuse per (owner, size)
constexpr uint8_t kPoison = 0xFF;        // NaN in every floating-point dtype

thread_local FakeMemory::Owner allocationOwnerOfThread;
thread_local bool untrackedOnThread = false;

}  // namespace

FakeMemory::FakeMemory() : passthrough_(c10::GetCPUAllocator()) {}

FakeMemory& FakeMemory::instance() {
  // Never destroyed: blocks it handed out may be freed during interpreter exit.
  static FakeMemory* memory = [] {
    auto* made = new FakeMemory();
    c10::SetCPUAllocator(made, /*priority=*/UINT8_MAX);
    return made;
  }();
  return *memory;
}

void FakeMemory::setAllocationOwner(Owner owner) { allocationOwnerOfThread = owner; }
FakeMemory::Owner FakeMemory::allocationOwner() { return allocationOwnerOfThread; }

FakeMemory::Untracked::Untracked() : previous_(untrackedOnThread) { untrackedOnThread = true; }
FakeMemory::Untracked::~Untracked() { untrackedOnThread = previous_; }

void FakeMemory::attach(uint64_t gpu, PoisonLater poisonLater) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gpus_[gpu] = std::move(poisonLater);
  }
  armed_.fetch_add(1);
}

void FakeMemory::detach(uint64_t gpu) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gpus_.erase(gpu);
  }
  armed_.fetch_sub(1);
}

c10::DataPtr FakeMemory::allocate(size_t bytes) {
  if (armed_.load() == 0 || bytes == 0 || untrackedOnThread) {
    return passthrough_->allocate(bytes);
  }
  Owner owner = allocationOwnerOfThread;
  std::lock_guard<std::mutex> lock(mutex_);
  if (owner.gpu != 0 && gpus_.count(owner.gpu) == 0) {
    owner = Owner{};  // the thread's GPU is gone: its default stream, of no GPU now
  }
  uint8_t* data = nullptr;
  const size_t capacity = (bytes + kSizeClass - 1) / kSizeClass * kSizeClass;
  auto& released = released_[{owner, capacity}];
  if (!released.empty()) {
    data = released.back();  // the caching allocator's reuse: the same block, at once
    released.pop_back();
    reuses_.fetch_add(1);
  } else {
    data = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, capacity));
    TORCH_CHECK(data != nullptr, "streamnccl fake memory: out of memory for ", bytes, " bytes");
  }
  blocks_[reinterpret_cast<uintptr_t>(data)] = Record{capacity, bytes, true, ++generations_, owner};
  return c10::DataPtr(data, data, &FakeMemory::release, c10::Device(c10::kCPU));
}

void FakeMemory::release(void* context) { instance().free(static_cast<uint8_t*>(context)); }

void FakeMemory::free(uint8_t* data) {
  PoisonLater poisonLater;
  Owner owner;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = blocks_.find(reinterpret_cast<uintptr_t>(data));
    TORCH_INTERNAL_ASSERT(found != blocks_.end(), "streamnccl fake memory: unknown block freed");
    Record& record = found->second;
    char thread[16] = {};
    pthread_getname_np(pthread_self(), thread, sizeof(thread));
    ++freesByThread_[thread];
    record.live = false;
    record.generation = ++generations_;
    owner = record.owner;
    generation = record.generation;
    auto& released = released_[{owner, record.bytes}];
    // A graph pool's blocks stay with the graph, which replays into them.
    if (released.size() < kReleasedPerSize || owner.pool != 0) {
      released.push_back(data);
    } else {
      blocks_.erase(found);
      std::free(data);
      return;
    }
    if (auto gpu = gpus_.find(owner.gpu); gpu != gpus_.end()) {
      poisonLater = gpu->second;
    } else {
      std::memset(data, kPoison, record.bytes);  // no stream orders it: at once
      return;
    }
  }
  // Outside the lock: the GPU takes its own, which it holds when it calls back in.
  poisonLater(owner, data, generation);
}

void FakeMemory::poisonIfStillFree(uint8_t* data, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = blocks_.find(reinterpret_cast<uintptr_t>(data));
  if (found != blocks_.end() && !found->second.live && found->second.generation == generation) {
    std::memset(data, kPoison, found->second.bytes);
  }
}

FakeMemory::Block FakeMemory::lookup(const void* pointer) const {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(mutex_);
  auto after = blocks_.upper_bound(address);
  if (after == blocks_.begin()) {
    return {};
  }
  const auto& [start, record] = *std::prev(after);
  if (address >= start + std::max<size_t>(record.bytes, 1)) {
    return {};
  }
  return Block{true, record.live, record.generation, record.owner, start, record.requested};
}

std::map<std::string, uint64_t> FakeMemory::freesByThread() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return freesByThread_;
}

void FakeMemory::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

}  // namespace streamnccl::fake
