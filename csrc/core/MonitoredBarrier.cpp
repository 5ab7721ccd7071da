#include "core/MonitoredBarrier.hpp"

#include "core/Errors.hpp"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace streamnccl {
namespace {

const std::string kRelease = "release";
const std::string kDeparted = "departed";
const std::string kGo = "go";

std::string arrivedKey(int rank) { return "arrived/" + std::to_string(rank); }

// Whether `key` is set within `timeout`, asking `stop` (which throws to stop) between looks.
// Asked with check(), which every Store answers at once (their wait()s time out with errors of
// different kinds, a FileStore's a plain one, and cannot be stopped).
bool setWithin(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
               const std::function<void()>& stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (!store.check({key})) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    stop();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  return true;
}

// Rank 0's part: the ranks that did not arrive in time (only the first, without waitAllRanks).
std::vector<int> missing(c10d::Store& store, int size, std::chrono::milliseconds timeout,
                         bool waitAllRanks, const std::string& who,
                         const std::function<void()>& stop) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::vector<int> late;
  for (int rank = 1; rank < size; ++rank) {
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
    if (!setWithin(store, arrivedKey(rank), left, stop)) {
      late.push_back(rank);
      if (!waitAllRanks) {
        break;
      }
    }
  }
  return late;
}

// After a barrier every rank passed: the last rank out deletes its keys, so that a group of the
// same name made later over the same Store (its barriers are counted from 0 again) finds none.
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
    stop();
    store.set(arrivedKey(rank), std::vector<uint8_t>{1});
    const std::string lost = who + " Rank " + std::to_string(rank) +
                             " successfully reached monitoredBarrier, but received errors "
                             "while waiting for send/recv from rank 0";
    // Rank 0 may take `timeout` to decide (with waitAllRanks, that for each rank it waits for):
    // this one waits that long and as long again, to hear its verdict rather than give up at
    // the same moment.
    const auto decision = waitAllRanks ? timeout * (size - 1) : timeout;
    if (!setWithin(store, kRelease, decision + timeout, stop)) {
      throwDistBackendError(lost + ": it did not let this rank go within " +
                            std::to_string((decision + timeout).count()) +
                            " ms. Please check rank 0 logs for faulty rank.");
    }
    const auto release = store.get(kRelease);
    const std::string verdict(release.begin(), release.end());
    if (verdict != kGo) {
      throwDistBackendError(lost + ": " + verdict);
    }
    leave(store, size);
    return;
  }
  // Whatever ends rank 0's wait, the others hear it at once.
  std::string verdict = kGo;
  try {
    stop();
    const std::vector<int> late = missing(store, size, timeout, waitAllRanks, who, stop);
    if (!late.empty()) {
      verdict = (late.size() == 1 ? "Rank " : "Ranks ") + c10::Join(", ", late) +
                " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) + " ms";
    }
  } catch (const c10::Error& e) {
    verdict = e.what_without_backtrace();
  }
  store.set(kRelease, std::vector<uint8_t>(verdict.begin(), verdict.end()));
  if (verdict != kGo) {
    throwDistBackendError(verdict.rfind(who, 0) == 0 ? verdict : who + " " + verdict);
  }
  leave(store, size);
}

}  // namespace streamnccl
