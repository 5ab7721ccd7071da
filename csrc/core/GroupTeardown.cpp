#include "core/GroupTeardown.hpp"

#include "core/Errors.hpp"

#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>
#include <c10/util/thread_name.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace streamnccl {
namespace {

// The teardowns running apart, counted so that the process's exit waits for them.
std::mutex apartMutex;
std::condition_variable apartEnded;
int apartRunning = 0;

}  // namespace

void GroupTeardown::run() {
  const std::string who = group.who();
  // Finishing what was issued, as gloo and the built-in nccl do: every rank's results are
  // complete before the communicators go. Bounded by the group's timeout, like every op.
  const auto deadline = Watchdog::Clock::now() + timeout;
  const bool finished = watchdog->finish(deadline);
  const auto unfinished = watchdog->unfinished();
  if (!finished && !health->broken()) {
    // Past the timeout: the ranks are no longer in step. Breaking the group fails these ops
    // (with the evidence dumped) and aborts the communicators, which a peer that never comes
    // would otherwise keep waiting forever.
    watchdog->breakGroup(
        group, makeDistBackendError(who + " destroyed with " + std::to_string(unfinished.size()) +
                                    " op(s) unfinished after the group's timeout of " +
                                    std::to_string(timeout.count()) + " ms (" +
                                    c10::Join(", ", unfinished) +
                                    "): aborting its communicators instead of finishing them"));
  }
  watchdog->stop();
  if (health->broken()) {
    LOG(WARNING) << who << " destroyed after it broke: its communicators were aborted";
    watchdog->failInFlightOfBrokenGroup();  // before their kernels are stopped
    watchdog->abortCommunicators();
  } else if (shrunk) {
    LOG(INFO) << who << " destroyed after shrink_group: its communicators were aborted, "
              << "not finalized (the ranks left out take no part in finalizing)";
    watchdog->abortCommunicators();
  } else {
    for (const auto& why : watchdog->closeCommunicators(deadline)) {
      LOG(ERROR) << who << " " << why;
    }
  }
  // Failed ops wait for their end, which the aborts let pass: a few seconds at most, and no
  // longer than the group's timeout.
  const auto grace = std::min<std::chrono::milliseconds>(std::chrono::seconds(10), timeout);
  if (const size_t kept = watchdog->releaseAll(Watchdog::Clock::now() + grace)) {
    LOG(ERROR) << who << " " << kept << " failed op(s) still had kernels queued after the "
               << "abort: their tensors are kept for good rather than freed under them";
  }
  // Each device finishes what its streams hold (the host's workers have nothing left).
  for (auto& path : paths) {
    path.reset();
  }
}

void reserveTeardownApart() {
  std::lock_guard<std::mutex> lock(apartMutex);
  ++apartRunning;
}

void unreserveTeardownApart() {
  std::lock_guard<std::mutex> lock(apartMutex);
  --apartRunning;
  apartEnded.notify_all();
}

void runApart(GroupTeardown teardown, bool reserved) {
  auto shared = std::make_shared<GroupTeardown>(std::move(teardown));
  auto runLogged = [](GroupTeardown& teardown) {
    try {
      teardown.run();
    } catch (...) {
      LOG(ERROR) << teardown.group.who()
                 << " teardown failed: " << describeException(std::current_exception());
    }
  };
  if (!reserved) {
    reserveTeardownApart();
  }
  try {
    std::thread([shared, runLogged]() mutable {
      c10::setThreadName("streamnccl-end");
      runLogged(*shared);
      shared.reset();  // let go of everything before saying it has ended
      unreserveTeardownApart();
    }).detach();
  } catch (...) {
    // No thread to be had: on this one, then, at the risk of waiting for it (see the header).
    LOG(ERROR) << shared->group.who() << " no thread for its teardown ("
               << describeException(std::current_exception())
               << "): it runs on the thread that let go of the group";
    unreserveTeardownApart();
    runLogged(*shared);
  }
}

void waitForTeardownsApart() {
  std::unique_lock<std::mutex> lock(apartMutex);
  apartEnded.wait(lock, [] { return apartRunning == 0; });
}

}  // namespace streamnccl
