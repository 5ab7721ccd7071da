#include "core/StoreKeys.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>

namespace streamnccl::keys {

c10::intrusive_ptr<c10d::Store> storeOfThisAttempt(const c10::intrusive_ptr<c10d::Store>& store) {
  TORCH_CHECK_VALUE(store, "streamnccl: a group needs a Store (got None)");
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (attempt == nullptr) {
    return store;
  }
  return c10::make_intrusive<c10d::PrefixStore>(std::string(kRoot) + "attempt/" + attempt + "/",
                                                store);
}

}  // namespace streamnccl::keys
