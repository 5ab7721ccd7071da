#include "core/SubgroupAgreement.hpp"

#include "core/Backoff.hpp"
#include "core/Errors.hpp"
#include "core/StoreKeys.hpp"

namespace streamnccl::agreement {

std::set<std::string> liveOnEveryRank(c10d::Store& store, int rank, int ranks,
                                      const std::set<std::string>& mine,
                                      std::chrono::milliseconds timeout, const std::string& what) {
  const std::string who =
      "[streamnccl rank " + std::to_string(rank) + "/" + std::to_string(ranks) + "] " + what + ": ";
  const std::string verdictKey = keys::splitVerdict();
  const std::string go = "go";
  for (const std::string& key : mine) {
    store.add(keys::splitLive(key), 1);
  }
  store.add(keys::splitArrived(), 1);  // after its counts: one that sees all arrived sees them
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Backoff backoff(std::chrono::milliseconds(1), std::chrono::milliseconds(50));
  std::string verdict;
  while (true) {
    if (store.check({verdictKey})) {
      const auto bytes = store.get(verdictKey);
      verdict.assign(bytes.begin(), bytes.end());
      break;
    }
    if (store.add(keys::splitArrived(), 0) >= ranks) {
      const auto bytes =
          store.compareSet(verdictKey, {}, std::vector<uint8_t>(go.begin(), go.end()));
      verdict.assign(bytes.begin(), bytes.end());
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      const std::string why = "rank " + std::to_string(rank) + " did not see every rank call it " +
                              "within " + std::to_string(timeout.count()) + " ms";
      const auto bytes =
          store.compareSet(verdictKey, {}, std::vector<uint8_t>(why.begin(), why.end()));
      verdict.assign(bytes.begin(), bytes.end());
      if (verdict == why) {
        throwDistBackendError(who + "not every rank that takes part called it within " +
                              std::to_string(timeout.count()) + " ms");
      }
      break;  // another rank settled it first
    }
    backoff.pause();
  }
  if (verdict != go) {
    throwDistBackendError(who + "another member gave up on it: " + verdict);
  }
  std::set<std::string> common;
  for (const std::string& key : mine) {
    if (store.add(keys::splitLive(key), 0) == ranks) {
      common.insert(key);
    }
  }
  return common;
}

void fail(const c10::intrusive_ptr<c10d::Store>& store, const std::string& reason) {
  if (store) {
    store->compareSet(keys::splitVerdict(), {}, std::vector<uint8_t>(reason.begin(), reason.end()));
  }
}

}  // namespace streamnccl::agreement
