#pragma once

// A map whose values are made on first use by a function that may block (opening a path can
// wait on a Store, or on peers). The map's lock is held only to find or claim a slot, never
// while a value is made: making one holds up only the callers that need that same value, never
// those of another key, the watchdog or abort().
//
// Every op looks its path up here, so the value found last is also kept where a lookup reads
// it without the lock: a lock and a hash for every op cost more than the rest of the lookup.

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace streamnccl {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class OnceMap {
 public:
  // The value of `key`, made by `make()` (a std::unique_ptr<Value>) unless another caller is
  // making it, in which case this one waits for it. If making it throws, every waiter gets the
  // error and the next call makes it afresh.
  template <typename Make>
  Value& get(const Key& key, Make&& make) {
    if (const Made* last = last_.load(std::memory_order_acquire); last && last->key == key) {
      return *last->value;
    }
    std::shared_ptr<Slot> slot;
    bool maker = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& found = slots_[key];
      if (found && found->value) {  // made already (every op but a path's first): no waiting
        last_.store(&*found->found, std::memory_order_release);
        return *found->value;
      }
      if (!found) {
        found = std::make_shared<Slot>();
        found->ready = found->made.get_future().share();
        maker = true;
      }
      slot = found;
    }
    if (!maker) {
      return *slot->ready.get();
    }
    try {
      std::unique_ptr<Value> value = make();
      Value* raw = value.get();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slot->value = std::move(value);
        slot->found.emplace(Made{key, raw});
      }
      slot->made.set_value(raw);
      return *raw;
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slots_.erase(key);
      }
      slot->made.set_exception(std::current_exception());
      throw;
    }
  }

  // Every value made so far, with its key. They live until clear().
  std::vector<std::pair<Key, Value*>> made() {
    std::vector<std::pair<Key, Value*>> values;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, slot] : slots_) {
      if (slot->value) {
        values.emplace_back(key, slot->value.get());
      }
    }
    return values;
  }

  // Empties the map; every value made lives on, at the same address, as long as the handle
  // returned (and is destroyed with it, outside the lock).
  std::shared_ptr<void> release() {
    auto slots = std::make_shared<std::unordered_map<Key, std::shared_ptr<Slot>, Hash>>();
    std::lock_guard<std::mutex> lock(mutex_);
    last_.store(nullptr, std::memory_order_release);
    slots->swap(slots_);
    return slots;
  }
  // Destroys every value made, outside the lock.
  void clear() { release(); }

 private:
  struct Made {
    Key key;
    Value* value;
  };
  struct Slot {
    std::promise<Value*> made;
    std::shared_future<Value*> ready;
    std::unique_ptr<Value> value;
    std::optional<Made> found;  // set with `value`, under the lock
  };

  std::mutex mutex_;
  // The slot found last, or null: read without the lock, written under it. A slot's `found`
  // lives as long as its value, and a caller may hold a value only until release() (see there).
  std::atomic<const Made*> last_{nullptr};
  std::unordered_map<Key, std::shared_ptr<Slot>, Hash> slots_;
};

}  // namespace streamnccl
