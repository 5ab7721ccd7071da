#include "fake/FakeMemory.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

namespace streamnccl::fake {
namespace {

constexpr size_t kAlignment = 64;        // as c10's CPU allocator
constexpr size_t kReleasedPerSize = 64;  // blocks kept for reuse per (stream, size)
constexpr uint8_t kPoison = 0xFF;        // NaN in every floating-point dtype

thread_local int64_t allocationStream = 0;

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

void FakeMemory::arm() { armed_.fetch_add(1); }
void FakeMemory::disarm() { armed_.fetch_sub(1); }

void FakeMemory::setAllocationStream(int64_t stream) { allocationStream = stream; }

c10::DataPtr FakeMemory::allocate(size_t bytes) {
  if (armed_.load() == 0 || bytes == 0) {
    return passthrough_->allocate(bytes);
  }
  const int64_t stream = allocationStream;
  std::lock_guard<std::mutex> lock(mutex_);
  uint8_t* data = nullptr;
  auto& released = released_[{stream, bytes}];
  if (!released.empty()) {
    data = released.back();  // the caching allocator's reuse: the same block, at once
    released.pop_back();
  } else {
    data = static_cast<uint8_t*>(
        std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment));
    TORCH_CHECK(data != nullptr, "streamnccl fake memory: out of memory for ", bytes, " bytes");
  }
  blocks_[reinterpret_cast<uintptr_t>(data)] = Record{bytes, true, ++generations_, stream};
  return c10::DataPtr(data, data, &FakeMemory::release, c10::Device(c10::kCPU));
}

void FakeMemory::release(void* context) { instance().free(static_cast<uint8_t*>(context)); }

void FakeMemory::free(uint8_t* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = blocks_.find(reinterpret_cast<uintptr_t>(data));
  TORCH_INTERNAL_ASSERT(found != blocks_.end(), "streamnccl fake memory: unknown block freed");
  Record& record = found->second;
  record.live = false;
  record.generation = ++generations_;
  std::memset(data, kPoison, record.bytes);
  auto& released = released_[{record.stream, record.bytes}];
  if (released.size() < kReleasedPerSize) {
    released.push_back(data);
  } else {
    blocks_.erase(found);
    std::free(data);
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
  return Block{true, record.live, record.generation, record.stream};
}

void FakeMemory::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

}  // namespace streamnccl::fake
