#include "core/StoreWait.hpp"

#include <algorithm>
#include <thread>

namespace streamnccl {

bool keysSetWithin(c10d::Store& store, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const std::function<void()>& stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (!store.check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    stop();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  return true;
}

}  // namespace streamnccl
