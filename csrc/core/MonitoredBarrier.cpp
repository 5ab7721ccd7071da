#include "core/MonitoredBarrier.hpp"

#include "core/Errors.hpp"
#include "core/StoreWait.hpp"

#include <c10/util/StringUtil.h>

#include <vector>

namespace streamnccl {
namespace {

const std::string kRelease = "release";
const std::string kDeparted = "departed";
const std::string kGo = "go";

// Set by each rank but 0 as it arrives: empty, or why it cannot take part (its group broke).
std::string arrivedKey(int rank) { return "arrived/" + std::to_string(rank); }

std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// Rank 0's verdict: kGo, or which ranks did not pass and why. Without waitAllRanks, it ends at
// the first rank that did not.
std::string verdictOf(c10d::Store& store, int size, std::chrono::milliseconds timeout,
                      bool waitAllRanks, const std::string& who,
                      const std::function<void()>& stop) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::vector<int> late;
  std::vector<std::string> broken;
  for (int rank = 1; rank < size && (waitAllRanks || (late.empty() && broken.empty())); ++rank) {
    // With waitAllRanks each rank gets the whole timeout, as in gloo's, so that every late
    // one is named; else the barrier as a whole must end within it.
    auto left =
        waitAllRanks
            ? timeout
            : std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= std::chrono::milliseconds(0)) {
      throwDistBackendError(who + " Rank 0 timed out in monitoredBarrier after " +
                            std::to_string(timeout.count()) + " ms, waiting for rank " +
                            std::to_string(rank));
    }
    if (!keysSetWithin(store, {arrivedKey(rank)}, left, stop)) {
      late.push_back(rank);
    } else if (const std::string why = text(store.get(arrivedKey(rank))); !why.empty()) {
      broken.push_back("Rank " + std::to_string(rank) + " failed to pass monitoredBarrier: " + why);
    }
  }
  if (!late.empty()) {
    broken.push_back((late.size() == 1 ? "Rank " : "Ranks ") + c10::Join(", ", late) +
                     " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) +
                     " ms");
  }
  return broken.empty() ? kGo : c10::Join("; ", broken);
}

// After reading the verdict (or giving up on one): the last rank out deletes the barrier's keys,
// so that a group of the same name made later over the same Store (its barriers are counted
// from 0 again) finds none. A rank that never arrived leaves them behind.
void leave(c10d::Store& store, int size) {
  if (store.add(kDeparted, 1) < size) {
    return;
  }
  for (int rank = 1; rank < size; ++rank) {
    store.deleteKey(arrivedKey(rank));
  }
  store.deleteKey(kRelease);
  store.deleteKey(kDeparted);
}

}  // namespace

void monitoredBarrier(c10d::Store& store, int rank, int size, std::chrono::milliseconds timeout,
                      bool waitAllRanks, const std::string& who,
                      const std::function<void()>& stop) {
  if (rank != 0) {
    try {
      stop();
    } catch (const c10::Error& e) {
      // Rank 0 names this rank, and why, at once, rather than wait for it.
      const std::string why = e.what_without_backtrace();
      store.set(arrivedKey(rank), std::vector<uint8_t>(why.begin(), why.end()));
      leave(store, size);
      throw;
    }
    store.set(arrivedKey(rank), std::vector<uint8_t>{});
    const std::string lost = who + " Rank " + std::to_string(rank) +
                             " successfully reached monitoredBarrier, but received errors "
                             "while waiting for send/recv from rank 0";
    // Rank 0 may take `timeout` to decide (with waitAllRanks, that for each rank it waits for):
    // this one waits that long and as long again, to hear its verdict rather than give up at
    // the same moment.
    const auto patience = (waitAllRanks ? timeout * (size - 1) : timeout) + timeout;
    if (!keysSetWithin(store, {kRelease}, patience, stop)) {
      throwDistBackendError(lost + ": it did not let this rank go within " +
                            std::to_string(patience.count()) +
                            " ms. Please check rank 0 logs for faulty rank.");
    }
    const std::string verdict = text(store.get(kRelease));
    leave(store, size);
    if (verdict != kGo) {
      throwDistBackendError(lost + ": " + verdict);
    }
    return;
  }
  // Whatever ends rank 0's wait, the others hear it at once.
  std::string verdict;
  try {
    stop();
    verdict = verdictOf(store, size, timeout, waitAllRanks, who, stop);
  } catch (const c10::Error& e) {
    verdict = e.what_without_backtrace();
  }
  store.set(kRelease, std::vector<uint8_t>(verdict.begin(), verdict.end()));
  leave(store, size);
  if (verdict != kGo) {
    throwDistBackendError(verdict.rfind(who, 0) == 0 ? verdict : who + " " + verdict);
  }
}

}  // namespace streamnccl
