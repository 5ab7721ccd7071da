#include "core/GroupRegistry.hpp"

#include "core/ProcessGroup.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <utility>

namespace streamnccl::groupRegistry {
namespace {

struct Entry {
  int64_t uid = 0;
  c10::weak_intrusive_ptr<ProcessGroup> group;
};

std::mutex mutex;
std::condition_variable removed;
std::vector<Entry>& entries() {
  static auto* made = new std::vector<Entry>();  // never destroyed: used at exit
  return *made;
}

}  // namespace

void add(const c10::intrusive_ptr<ProcessGroup>& group, int64_t uid) {
  std::lock_guard<std::mutex> lock(mutex);
  entries().push_back(Entry{uid, c10::weak_intrusive_ptr<ProcessGroup>(group)});
}

void remove(const ProcessGroup* group) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& all = entries();
    all.erase(std::remove_if(all.begin(), all.end(),
                             [group](const Entry& entry) {
                               return entry.group._unsafe_get_target() == group;
                             }),
              all.end());
  }
  removed.notify_all();
}

std::vector<c10::intrusive_ptr<ProcessGroup>> alive(bool afterTheDying) {
  std::unique_lock<std::mutex> lock(mutex);
  if (afterTheDying) {
    removed.wait(lock, [] {
      return std::none_of(entries().begin(), entries().end(),
                          [](const Entry& entry) { return entry.group.expired(); });
    });
  }
  std::vector<std::pair<int64_t, c10::intrusive_ptr<ProcessGroup>>> found;
  for (const Entry& entry : entries()) {
    if (auto group = entry.group.lock()) {
      found.emplace_back(entry.uid, std::move(group));
    }
  }
  lock.unlock();
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<c10::intrusive_ptr<ProcessGroup>> groups;
  groups.reserve(found.size());
  for (auto& [uid, group] : found) {
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace streamnccl::groupRegistry
