#include "fake/FakeNcclWorld.hpp"

#include <cstring>

namespace streamnccl::fake {

ncclUniqueId FakeNcclWorld::newId() {
  ncclUniqueId id{};
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t key = ++idsMade_;
  std::memcpy(id.internal, &key, sizeof(key));
  return id;
}

uint64_t FakeNcclWorld::keyOf(const ncclUniqueId& id) {
  uint64_t key = 0;
  std::memcpy(&key, id.internal, sizeof(key));
  return key;
}

void FakeNcclWorld::join(uint64_t key, int /*rank*/, int nranks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Meeting& meeting = meetings_[key];
    meeting.nranks = nranks;
    meeting.joined = simulatePeers_ ? nranks : meeting.joined + 1;
  }
  changed_.notify_all();
}

bool FakeNcclWorld::complete(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = meetings_.find(key);
  return found != meetings_.end() && found->second.joined >= found->second.nranks;
}

bool FakeNcclWorld::waitComplete(uint64_t key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    const Meeting& meeting = meetings_[key];
    return meeting.joined >= meeting.nranks;
  });
}

}  // namespace streamnccl::fake
