// The makers of hooks added from outside the product (Hooks.hpp's addHookMaker).

#include "core/hooks/Hooks.hpp"

#include <mutex>

namespace streamnccl::hooks {
namespace {

struct Makers {
  std::mutex mutex;
  std::vector<HookMaker> added;
};

Makers& makers() {
  static auto* const all = new Makers;  // never destroyed: a group may be made at exit
  return *all;
}

}  // namespace

void addHookMaker(HookMaker maker) {
  std::lock_guard<std::mutex> lock(makers().mutex);
  makers().added.push_back(std::move(maker));
}

std::vector<HookMaker> hookMakers() {
  std::lock_guard<std::mutex> lock(makers().mutex);
  return makers().added;
}

}  // namespace streamnccl::hooks
