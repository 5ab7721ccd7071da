#include "core/GroupRegistry.hpp"

#include "core/Watchdog.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <utility>

namespace streamnccl::groupRegistry {
namespace {

struct Entry {
  int64_t uid = 0;
  c10::weak_intrusive_ptr<c10d::Backend> group;
  std::weak_ptr<Watchdog> watchdog;
};

// Never destroyed: a group whose last reference torch's own registry drops during the
// process's static destruction still leaves this one.
struct Registry {
  std::mutex mutex;
  std::condition_variable removed;
  std::vector<Entry> entries;
};
Registry& registry() {
  static auto* made = new Registry();
  return *made;
}

}  // namespace

void add(const c10::intrusive_ptr<c10d::Backend>& group, int64_t uid,
         const std::shared_ptr<Watchdog>& watchdog) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries.push_back(Entry{uid, c10::weak_intrusive_ptr<c10d::Backend>(group), watchdog});
}

void remove(const c10d::Backend* group) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.entries.erase(std::remove_if(r.entries.begin(), r.entries.end(),
                                   [group](const Entry& entry) {
                                     return entry.group._unsafe_get_target() == group;
                                   }),
                    r.entries.end());
  }
  r.removed.notify_all();
}

std::vector<c10::intrusive_ptr<c10d::Backend>> alive() {
  Registry& r = registry();
  std::vector<std::pair<int64_t, c10::weak_intrusive_ptr<c10d::Backend>>> entries;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const Entry& entry : r.entries) {
      entries.emplace_back(entry.uid, entry.group);
    }
  }
  // Promoted outside the lock: from torch 2.14 a Backend keeps its Python object, and taking a
  // reference to a group may take the GIL, which a thread adding a group holds while it waits
  // for this lock.
  std::vector<std::pair<int64_t, c10::intrusive_ptr<c10d::Backend>>> found;
  for (auto& [uid, weak] : entries) {
    if (auto group = weak.lock()) {
      found.emplace_back(uid, std::move(group));
    }
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<c10::intrusive_ptr<c10d::Backend>> groups;
  groups.reserve(found.size());
  for (auto& [uid, group] : found) {
    groups.push_back(std::move(group));
  }
  return groups;
}

void waitForTheDying() {
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.mutex);
  r.removed.wait(lock, [&r] {
    return std::none_of(r.entries.begin(), r.entries.end(),
                        [](const Entry& entry) { return entry.group.expired(); });
  });
}

std::vector<std::shared_ptr<Watchdog>> watchdogs() {
  Registry& r = registry();
  std::vector<std::shared_ptr<Watchdog>> found;
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const Entry& entry : r.entries) {
    if (auto watchdog = entry.watchdog.lock()) {
      found.push_back(std::move(watchdog));
    }
  }
  return found;
}

}  // namespace streamnccl::groupRegistry
