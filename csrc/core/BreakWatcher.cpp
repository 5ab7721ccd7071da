#include "core/BreakWatcher.hpp"

#include "core/GroupThreads.hpp"

#include <c10/util/Logging.h>
#include <c10/util/thread_name.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace streamnccl::breakWatcher {
namespace {

// Never destroyed: groups let go of during the process's static destruction still leave it.
struct Watcher {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<std::weak_ptr<BreakBoard>> boards;
  uint64_t generation = 0;  // stop() counts one: the thread of an earlier one ends
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
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    ++w.generation;
    thread = std::move(w.thread);
  }
  w.wake.notify_all();
  if (thread.joinable()) {
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();  // the exit reached from a break on this thread: it ends on its own
    } else {
      thread.join();
    }
  }
}

}  // namespace streamnccl::breakWatcher
