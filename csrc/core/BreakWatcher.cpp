#include "core/BreakWatcher.hpp"

#include "core/GroupThreads.hpp"

#include <c10/util/Logging.h>
#include <c10/util/ScopeExit.h>
#include <c10/util/thread_name.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace streamnccl::breakWatcher {
namespace {

constexpr auto kStopWait = std::chrono::seconds(2);

// Never destroyed: groups let go of during the process's static destruction still leave it.
struct Watcher {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<std::weak_ptr<BreakBoard>> boards;
  uint64_t generation = 0;  // stop() counts one: the thread of an earlier one ends
  uint64_t ended = 0;       // one past the generation of the last thread that ended
  std::thread thread;
};
Watcher& watcher() {
  static auto* made = new Watcher();
  return *made;
}

// Looks at every board still open. False once there is none: the thread then ends (with the
// lock held, so that a watch() meanwhile starts another), and starts again at the next watch().
bool lookAtEach(Watcher& w) {
  std::vector<std::shared_ptr<BreakBoard>> boards;
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    auto kept = std::remove_if(w.boards.begin(), w.boards.end(), [](const auto& board) {
      auto held = board.lock();
      return !held || held->closed();
    });
    w.boards.erase(kept, w.boards.end());
    if (w.boards.empty()) {
      if (w.thread.get_id() == std::this_thread::get_id()) {  // else stop() took it, to join
        w.thread.detach();  // it ends here, and no group waits for it
      }
      return false;
    }
    for (const auto& board : w.boards) {
      if (auto held = board.lock()) {
        boards.push_back(std::move(held));
      }
    }
  }
  for (const auto& board : boards) {
    // The group breaks on this thread (a group thread: a teardown it sets off runs apart).
    if (auto post = board->look()) {
      board->posted(*post);
    }
  }
  return true;
}

void run(uint64_t generation) {
  c10::setThreadName("streamnccl-brk");
  markGroupThread();
  Watcher& w = watcher();
  auto ended = c10::make_scope_exit([&w, generation] {
    {
      std::lock_guard<std::mutex> lock(w.mutex);
      w.ended = std::max(w.ended, generation + 1);
    }
    w.wake.notify_all();  // stop() waits for this
  });
  while (true) {
    {
      std::unique_lock<std::mutex> lock(w.mutex);
      if (w.wake.wait_for(lock, kPeriod, [&] { return w.generation != generation; })) {
        return;
      }
    }
    try {
      if (!lookAtEach(w)) {
        return;
      }
    } catch (const std::exception& e) {  // a group's break failed: the others are still looked at
      LOG(ERROR) << "streamnccl: the break watcher: " << e.what();
    }
  }
}

}  // namespace

void watch(const std::shared_ptr<BreakBoard>& board) {
  Watcher& w = watcher();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.boards.push_back(board);
  if (!w.thread.joinable()) {
    w.thread = std::thread(run, w.generation);
  }
}

void stop() {
  Watcher& w = watcher();
  std::thread thread;
  std::unique_lock<std::mutex> lock(w.mutex);
  const uint64_t stopped = ++w.generation;
  thread = std::move(w.thread);
  w.wake.notify_all();
  if (!thread.joinable()) {
    return;
  }
  // Bounded: a look at a Store whose host vanished may not return for minutes, and the exit
  // must not wait for it (the thread then ends on its own, or with the process).
  const bool ended = thread.get_id() != std::this_thread::get_id() &&
                     w.wake.wait_for(lock, kStopWait, [&] { return w.ended >= stopped; });
  lock.unlock();
  if (ended) {
    thread.join();
  } else {
    thread.detach();
  }
}

}  // namespace streamnccl::breakWatcher
