#include "core/Watchdog.hpp"

#include "core/Errors.hpp"

#include <c10/util/thread_name.h>

#include <algorithm>

namespace streamnccl {
namespace {

constexpr auto kPeriod = std::chrono::milliseconds(50);

}  // namespace

std::shared_ptr<Watchdog> Watchdog::start(std::shared_ptr<GroupHealth> health,
                                          std::shared_ptr<GroupStats> stats,
                                          std::function<OpInfo()> describeGroup) {
  std::shared_ptr<Watchdog> watchdog(
      new Watchdog(std::move(health), std::move(stats), std::move(describeGroup)));
  watchdog->thread_ = std::thread([raw = watchdog.get()] {  // joined by stop()
    c10::setThreadName("streamnccl-wdog");
    raw->loop();
  });
  return watchdog;
}

Watchdog::Watchdog(std::shared_ptr<GroupHealth> health, std::shared_ptr<GroupStats> stats,
                   std::function<OpInfo()> describeGroup)
    : health_(std::move(health)),
      stats_(std::move(stats)),
      describeGroup_(std::move(describeGroup)) {}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(stopMutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  std::lock_guard<std::mutex> lock(joinMutex_);  // one joiner at a time
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(stopMutex_);
  while (!wake_.wait_for(lock, kPeriod, [&] { return stopping_; })) {
    lock.unlock();
    check();
    lock.lock();
  }
}

void Watchdog::watch(std::shared_ptr<Communicator> communicator) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    communicators_.push_back(communicator);
    if (!aborted_) {
      return;
    }
  }
  communicator->abort();  // opened while the group was being broken
}

void Watchdog::track(c10::intrusive_ptr<Work> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!brokenReason_.empty()) {
    // Launched while the group was being broken: its kernel may have been aborted too.
    work->fail(brokenReason_);
    retire(*work);
    done_.push_back(std::move(work));
    return;
  }
  inFlight_.push_back(std::move(work));
}

void Watchdog::collectCompleted() {
  auto done = std::stable_partition(inFlight_.begin(), inFlight_.end(),
                                    [](const auto& work) { return !work->isCompleted(); });
  for (auto work = done; work != inFlight_.end(); ++work) {
    retire(**work);
    done_.push_back(std::move(*work));
  }
  inFlight_.erase(done, inFlight_.end());
}

void Watchdog::releaseCompleted() {
  std::vector<c10::intrusive_ptr<Work>> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collectCompleted();
    released.swap(done_);
  }
  // `released` goes here, outside the lock, with its tensors.
}

void Watchdog::check() {
  std::vector<c10::intrusive_ptr<Work>> expired;
  std::vector<std::shared_ptr<Communicator>> communicators;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collectCompleted();  // recorded now; released by the next caller that launches or waits
    const auto now = std::chrono::steady_clock::now();
    for (const auto& work : inFlight_) {
      if (now > work->deadline()) {
        expired.push_back(work);
      }
    }
    communicators = liveCommunicators(/*locked=*/true);
  }
  for (const auto& work : expired) {
    const std::string reason =
        "timed out after " + std::to_string(work->timeout().count()) + " ms (streamnccl watchdog)";
    work->fail(reason);
    retire(*work);
    breakGroup(work->info(), work->exception());
  }
  if (!expired.empty()) {
    // Released on a caller's thread like every other op, never here.
    std::lock_guard<std::mutex> lock(mutex_);
    done_.insert(done_.end(), expired.begin(), expired.end());
  }
  for (const auto& communicator : communicators) {
    if (std::string error = communicator->asyncError(); !error.empty()) {
      const OpInfo group = describeGroup_();
      breakGroup(group, makeDistBackendError(group.who() + " " + error));
      break;
    }
  }
}

void Watchdog::breakGroup(const OpInfo& group, std::exception_ptr error) {
  if (!health_->breakWith(group, error)) {
    return;
  }
  const std::string reason = "the group broke: " + describeException(error);
  std::vector<c10::intrusive_ptr<Work>> failing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failing.swap(inFlight_);
    brokenReason_ = reason;  // ops tracked from now on fail at once (track())
  }
  for (const auto& work : failing) {
    work->fail(reason);
    retire(*work);
  }
  abortCommunicators();
  // Only now, with their kernels stopped, may the failed ops' tensors go (on a caller's
  // thread, by releaseCompleted()).
  std::lock_guard<std::mutex> lock(mutex_);
  done_.insert(done_.end(), failing.begin(), failing.end());
}

void Watchdog::retire(Work& work) {
  if (!work.markRetired()) {
    return;
  }
  if (work.isSuccess()) {
    const auto duration = work.durationMs();
    health_->recorder().completed(work.info().traceId, duration);
    stats_->ended(work.retrieveOpType(), /*succeeded=*/true, duration);
  } else {
    health_->recorder().failed(work.info().traceId, describeException(work.exception()));
    stats_->ended(work.retrieveOpType(), /*succeeded=*/false, std::nullopt);
  }
}

void Watchdog::abortCommunicators() {
  // Once; a concurrent caller (the group's teardown beside a failing op) waits until the
  // aborts have returned, so that it lets no tensor go before.
  std::call_once(abortOnce_, [&] {
    std::vector<std::shared_ptr<Communicator>> communicators;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_ = true;  // a communicator watched from now on is aborted at once (watch())
      communicators = liveCommunicators(/*locked=*/true);
    }
    for (const auto& communicator : communicators) {
      communicator->abort();
    }
  });
}

void Watchdog::stopConnecting() {
  for (const auto& communicator : liveCommunicators()) {
    communicator->stopConnecting();
  }
}

std::vector<std::shared_ptr<Communicator>> Watchdog::liveCommunicators(bool locked) {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (!locked) {
    lock.lock();
  }
  std::vector<std::shared_ptr<Communicator>> live;
  for (const auto& weak : communicators_) {
    if (auto communicator = weak.lock()) {
      live.push_back(std::move(communicator));
    }
  }
  return live;
}

void Watchdog::releaseAll() {
  std::vector<c10::intrusive_ptr<Work>> released;
  std::lock_guard<std::mutex> lock(mutex_);
  released.swap(inFlight_);
  released.insert(released.end(), done_.begin(), done_.end());
  done_.clear();
}

bool Watchdog::mustAbortAtTeardown() {
  if (health_->broken()) {
    return true;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  collectCompleted();
  return !inFlight_.empty();
}

}  // namespace streamnccl
