#include "core/StoreWait.hpp"

#include "core/Backoff.hpp"

namespace streamnccl {

bool keysSetWithin(c10d::Store& store, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const std::function<void()>& stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Backoff backoff(std::chrono::milliseconds(1), std::chrono::milliseconds(100));
  while (!store.check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    stop();
    backoff.pause();
  }
  return true;
}

}  // namespace streamnccl
