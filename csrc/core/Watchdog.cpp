#include "core/Watchdog.hpp"

#include "core/Backoff.hpp"
#include "core/BreakWatcher.hpp"
#include "core/Errors.hpp"
#include "core/GroupThreads.hpp"
#include "core/StateMoves.hpp"

#include <c10/util/Logging.h>
#include <c10/util/ScopeExit.h>
#include <c10/util/SmallVector.h>
#include <c10/util/thread_name.h>

#include <algorithm>
#include <future>
#include <iterator>

namespace streamnccl {
namespace {

constexpr auto kPeriod = std::chrono::milliseconds(50);
// How much longer than its roll call a break waits for the Store to take its post.
constexpr auto kStoreGrace = std::chrono::milliseconds(1000);

// Moves the elements of `from` for which `take` holds to the end of `to`, keeping the order
// of both; moved, never copied, so that no reference is dropped here.
template <typename Take>
void moveWhere(std::vector<c10::intrusive_ptr<Work>>& from,
               std::vector<c10::intrusive_ptr<Work>>& to, Take take) {
  auto kept = from.begin();
  for (auto& work : from) {
    if (take(*work)) {
      to.push_back(std::move(work));
    } else {
      *kept++ = std::move(work);
    }
  }
  from.erase(kept, from.end());
}

void append(std::vector<c10::intrusive_ptr<Work>>& to,
            std::vector<c10::intrusive_ptr<Work>>& from) {
  to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  from.clear();
}

}  // namespace

std::shared_ptr<Watchdog> Watchdog::start(std::shared_ptr<GroupHealth> health,
                                          std::shared_ptr<GroupStats> stats,
                                          std::function<OpInfo()> describeGroup,
                                          std::shared_ptr<BreakBoard> board) {
  std::shared_ptr<Watchdog> watchdog(
      new Watchdog(std::move(health), std::move(stats), std::move(describeGroup), board));
  if (board) {
    breakWatcher::watch(board);
  }
  // The thread holds the watchdog one period at a time: if its last owner lets go meanwhile
  // (the group destroyed elsewhere without stop(), which close() never does), ~Watchdog runs
  // on this thread at the period's end, detaches it, and the loop ends on the expired weak_ptr.
  watchdog->thread_ = std::thread([weak = std::weak_ptr<Watchdog>(watchdog)] {
    c10::setThreadName("streamnccl-wdog");
    markGroupThread();
    while (auto self = weak.lock()) {
      if (!self->waitThenCheck()) {
        return;
      }
    }
  });
  return watchdog;
}

Watchdog::Watchdog(std::shared_ptr<GroupHealth> health, std::shared_ptr<GroupStats> stats,
                   std::function<OpInfo()> describeGroup, std::shared_ptr<BreakBoard> board)
    : health_(std::move(health)),
      stats_(std::move(stats)),
      board_(std::move(board)),
      describeGroup_(std::move(describeGroup)) {}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  if (board_) {
    board_->close();  // the group has ended: a break posted now is not its
  }
  {
    std::lock_guard<std::mutex> lock(stopMutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  {
    std::lock_guard<std::mutex> lock(joinMutex_);  // one joiner at a time
    // On the watchdog's own thread (~Watchdog at the end of its period): joining would wait
    // for ourselves, and a std::thread destroyed joinable ends the process.
    if (thread_.joinable() && thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else if (thread_.joinable()) {
      thread_.join();
    }
  }
  hooks_->stop();  // after the thread: the ops it retired last are told too
}

OpInfo Watchdog::describeGroup() {
  std::lock_guard<std::mutex> lock(describeMutex_);
  return describeGroup_();
}

void Watchdog::describeGroupAs(const OpInfo& group) {
  std::lock_guard<std::mutex> lock(describeMutex_);  // waits for a description under way
  describeGroup_ = [group] { return group; };
}

bool Watchdog::waitThenCheck() {
  {
    std::unique_lock<std::mutex> lock(stopMutex_);
    if (wake_.wait_for(lock, kPeriod, [&] { return stopping_; })) {
      return false;
    }
  }
  // Nothing may escape this thread: an exception here would end the process without a
  // word. Whatever goes wrong breaks the group instead, with the evidence.
  try {
    check();
  } catch (...) {
    breakGroup(describeGroup(), makeDistBackendError(describeGroup().who() + " watchdog: " +
                                                     describeException(std::current_exception())));
  }
  return true;
}

void Watchdog::watch(std::shared_ptr<Communicator> communicator) {
  communicator->setBreakRequest([weak = weak_from_this()](const std::string& why) {
    if (auto self = weak.lock()) {
      const OpInfo group = self->describeGroup();
      self->breakGroup(group, makeDistBackendError(group.who() + " " + why));
      self->awaitOpsFailed();  // its caller aborts next: the ops must have failed first
    }
  });
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
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (brokenReason_.empty()) {
      inFlight_.add(std::move(work));
      return;
    }
    broken = brokenReason_;
  }
  // Launched while the group was being broken: its kernel may have been aborted too. Failed
  // without the lock: failing runs the future's callbacks.
  work->fail(broken);
  retire(*work);
  std::lock_guard<std::mutex> lock(mutex_);
  failedRunning_.push_back(std::move(work));
}

void Watchdog::trackCaptured(c10::intrusive_ptr<Work> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  captured_.push_back(std::move(work));
}

void Watchdog::collectEnded(Works& faulted, RecorderClock& clock, Look look) {
  // An op whose end has passed moves to ended_, one that faulted to `faulted`.
  const auto leaves = [&](c10::intrusive_ptr<Work>& work) {
    if (work->pollStarted()) {
      health_->recorder().started(work->info().traceId);
    }
    const Work::EndState state = work->pollEnd();
    if (state == Work::EndState::Pending) {
      return false;
    }
    if (state == Work::EndState::Passed) {
      retire(*work, clock);
      ended_.push_back(std::move(work));
    } else {
      faulted.push_back(std::move(work));
    }
    return true;
  };
  inFlight_.look(look, leaves);
  for (auto& work : failedRunning_) {
    leaves(work);  // a null left in its place where it leaves
  }
  std::erase_if(failedRunning_, [](const auto& work) { return !work; });
  moveWhere(captured_, ended_, [](Work& work) { return work.joined(); });
}

void Watchdog::settle(Works& faulted) {
  // Counted as failed, and the dump written, before any of these ops fails: a caller polling
  // for the failure (a blocking wait) then finds the dump. Meanwhile they are in no list, so
  // nothing counts them again, and they go to ended_ once failed (moved: this thread never
  // holds a Work's last reference).
  std::exception_ptr fault;
  for (auto& work : faulted) {
    const std::exception_ptr error = work->failureFor(work->deviceError());
    retireFailed(*work, error);
    if (!fault) {
      fault = error;
    }
  }
  auto failFaulted = [&](const std::string& /*news*/) {  // a device's own error says it all
    auto handOn = c10::make_scope_exit([&] {
      std::lock_guard<std::mutex> lock(mutex_);
      append(ended_, faulted);  // their device runs nothing more: nothing uses their memory
    });
    for (auto& work : faulted) {
      work->failWithDeviceError();
    }
  };
  if (timingFaulted_.load(std::memory_order_acquire)) {  // rare: not locked for on every op
    std::lock_guard<std::mutex> lock(timingFaultMutex_);
    if (!fault) {
      fault = std::exchange(timingFault_, nullptr);
      timingFaulted_.store(false, std::memory_order_release);
    }
  }
  if (fault) {
    const OpInfo group = describeGroup();
    breakGroup(group, makeDistBackendError(group.who() + " " + describeException(fault)),
               failFaulted);
  }
}

void Watchdog::failOnDeviceError(Work& work, std::exception_ptr cause) {
  const std::exception_ptr error = work.failureFor(cause);
  health_->recorder().failed(work.info().traceId, describeException(error));
  const OpInfo group = describeGroup();
  breakGroup(group, makeDistBackendError(group.who() + " " + describeException(error)),
             [&](const std::string& news) { work.fail(withNews(cause, news)); });
}

void Watchdog::releaseCompleted(RecorderClock& clock, Look look) {
  Works faulted;
  // Moved out rather than swapped: `ended_` keeps its capacity, so that the next op's end is
  // recorded without an allocation (this runs at every launch).
  c10::SmallVector<c10::intrusive_ptr<Work>, 4> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collectEnded(faulted, clock, look);
    released.append(std::make_move_iterator(ended_.begin()), std::make_move_iterator(ended_.end()));
    ended_.clear();
  }
  // A fault settled may break the group, which takes long: later records read the clock anew.
  const bool faults = !faulted.empty() || timingFaulted_.load(std::memory_order_acquire);
  settle(faulted);
  if (faults) {
    clock.reset();
  }
  for (auto& work : released) {
    work->releaseTensors();
  }
  // The last references the group held go in launch order (what a Work's end logs, the
  // in-flight write check's one warning, names the earliest op).
  for (auto& work : released) {
    work.reset();
  }
}

void Watchdog::check() {
  if (board_) {
    if (auto post = board_->takePosted()) {
      learnBreak(*post);  // found by the process's watcher; broken here, on this group's thread
    }
  }
  Works faulted;
  {
    RecorderClock clock;
    std::lock_guard<std::mutex> lock(mutex_);
    collectEnded(faulted,
                 clock);  // recorded now; released by the next caller that launches or waits
  }
  // First: a device error found here breaks the group on this thread, which must then hold
  // no op out of flight (the break would wait for it to fail).
  settle(faulted);
  Works expired;
  std::vector<std::shared_ptr<Communicator>> communicators;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    inFlight_.takeWhere([&](Work& work) { return work.expiredBy(now); }, expired);
    opsOutside_ += expired.size();
    communicators = liveCommunicators(/*locked=*/true);
  }
  auto orphaned = handOnIfNeverFailed(expired);
  if (!expired.empty()) {
    // Counted as failed, and the dump written, before they fail: a caller polling for the
    // failure (a blocking wait, a wait with a timeout) then finds the dump. Meanwhile they are
    // in no list (nothing counts them again), and once failed they wait for their end.
    std::vector<std::exception_ptr> timeouts;
    for (auto& work : expired) {
      const std::string& path = work->info().path;
      timeouts.push_back(std::make_exception_ptr(std::runtime_error(
          "timed out after " + std::to_string(work->timeout().count()) +
          " ms (streamnccl watchdog)" + (path.empty() ? "" : " on the " + path))));
      retireFailed(*work, work->failureFor(timeouts.back()));
    }
    auto failExpired = [&](const std::string& news) {
      auto handOn = c10::make_scope_exit([&] { handOnFailed(expired); });
      for (size_t i = 0; i < expired.size(); ++i) {
        expired[i]->fail(withNews(timeouts[i], news));
      }
    };
    breakGroup(expired.front()->info(), expired.front()->failureFor(timeouts.front()), failExpired,
               BreakAs{GroupHealth::Cause::Timeout});
  }
  for (const auto& communicator : communicators) {
    if (std::string error = communicator->asyncError(); !error.empty()) {
      const OpInfo group = describeGroup();
      breakGroup(group, makeDistBackendError(group.who() + " " + error));
      break;
    }
  }
}

std::exception_ptr Watchdog::withNews(std::exception_ptr cause, const std::string& news) {
  if (news.empty()) {
    return cause;
  }
  return makeDistBackendError(describeException(cause) + news);
}

std::string Watchdog::shareBreak(const std::exception_ptr& error, BreakAs& as) {
  if (!board_ || !as.shared) {
    return {};
  }
  const bool learned = as.cause == GroupHealth::Cause::Remote;
  // On a thread of its own, waited for a bounded time: a Store whose host vanished may not
  // answer for minutes, and the break (failing the ops, aborting) must not wait for it.
  auto promise = std::make_shared<std::promise<BreakBoard::News>>();
  auto answered = promise->get_future();
  std::optional<std::string> mine;
  if (!learned) {
    mine = describeException(error);
  }
  std::thread([board = board_, promise, mine, rollCall = as.rollCall] {
    c10::setThreadName("streamnccl-post");
    promise->set_value(board->announce(mine, rollCall));
  }).detach();
  if (answered.wait_for(BreakBoard::kRollCall + kStoreGrace) != std::future_status::ready) {
    LOG(WARNING) << describeGroup().who() << " the Store did not answer within "
                 << (BreakBoard::kRollCall + kStoreGrace).count()
                 << " ms: this break is not shared with the other ranks";
    return {};
  }
  const BreakBoard::News news = answered.get();
  std::string text;
  if (!learned && news.first && news.first->rank != board_->rank()) {
    // Another rank's break was posted before this one's: this fault is likely its echo (a peer
    // that closed its connections as its group broke), and the group's break came from there.
    as.cause = GroupHealth::Cause::Remote;
    text = "; " + BreakBoard::describe(*news.first, "first");
  }
  return text + BreakBoard::describeSilent(news.silent);
}

void Watchdog::learnBreak(const BreakBoard::Post& post) {
  // As at a deadline (check()): the ops whose end has passed are retired as completed, and
  // those still in flight are counted failed, and the dump written, before they fail, so that
  // the dump shows where this rank stood. Meanwhile they are in no list; once failed they wait
  // for their end.
  Works faulted;
  {
    RecorderClock clock;
    std::lock_guard<std::mutex> lock(mutex_);
    collectEnded(faulted, clock);
  }
  settle(faulted);  // first, as in check()
  Works stopped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped = inFlight_.takeAll();
    opsOutside_ += stopped.size();
  }
  auto orphaned = handOnIfNeverFailed(stopped);
  const OpInfo group = describeGroup();
  const auto error = makeDistBackendError(group.who() + " " + BreakBoard::describe(post));
  for (auto& work : stopped) {
    retireFailed(*work, work->failureFor(error));
  }
  auto failStopped = [&](const std::string& news) {
    auto handOn = c10::make_scope_exit([&] { handOnFailed(stopped); });
    for (auto& work : stopped) {
      work->fail(withNews(error, news));
    }
  };
  breakGroup(group, error, failStopped, BreakAs{GroupHealth::Cause::Remote});
}

void Watchdog::breakGroup(const OpInfo& group, std::exception_ptr error, const FailCause& failCause,
                          BreakAs as) {
  // The first call breaks the group, once the roll call's news is in its cause; the others
  // wait for that, and their ops too carry the news.
  const bool broke = health_->claimBreak();
  std::string news;
  if (broke) {
    // Nothing between the claim and breakWith() may leave the group claimed but never broken:
    // every other break would wait for it (awaitBreak()), and the group would never fail.
    try {
      news = shareBreak(error, as);
      error = withNews(error, news);
      std::lock_guard<std::mutex> lock(mutex_);
      // For the calls that lost the claim. Where the break came from another rank, theirs are
      // echoes of it (a peer that closed its connections): their errors say where it began.
      breakNews_ = as.cause == GroupHealth::Cause::Remote ? "; " + describeException(error) : news;
    } catch (...) {  // out of memory, or no thread to post from: the break goes on unshared
      LOG(ERROR) << group.who() << " sharing the break failed: it breaks this rank's group only";
    }
    try {
      health_->breakWith(group, error, as.cause);  // returns once the evidence is written
    } catch (...) {  // the evidence failed to write: the group is broken all the same
      LOG(ERROR) << group.who() << " breaking the group: its evidence could not be written";
    }
  } else {
    health_->awaitBreak();
    std::lock_guard<std::mutex> lock(mutex_);
    news = breakNews_;
  }
  const std::string reason = "the group broke: " + describeException(error);
  Works failing;
  if (broke) {
    // Taken before the cause's ops fail, whose futures' callbacks may end the group: its
    // teardown then finds the group broken and every op in a list it lets go of.
    std::lock_guard<std::mutex> lock(mutex_);
    failing = inFlight_.takeAll();
    brokenReason_ = reason;  // ops tracked from now on fail at once (track())
    breaker_ = std::this_thread::get_id();
    moveState(breaking_, Breaking::FailingOps, kBreakingMoves, "a group's break");
  }
  if (failCause) {
    try {
      failCause(news);                   // first: those ops keep their own error
    } catch (const std::exception& e) {  // a future's callback: the group must still break
      LOG(ERROR) << group.who() << " failing the ops that broke the group: " << e.what();
    }
  }
  if (!broke) {
    return;
  }
  {
    auto opsFailed = c10::make_scope_exit([this] {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        moveState(breaking_, Breaking::OpsFailed, kBreakingMoves, "a group's break");
      }
      opsFailedChanged_.notify_all();
    });
    failUntilTheirEnd(failing, reason);
    awaitOpsOutside();
  }
  if (as.kernels == Kernels::Abort) {
    abortCommunicators();
  }
}

void Watchdog::handOnFailed(Works& works) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    opsOutside_ -= works.size();
    append(failedRunning_, works);  // let go once their end has passed (empties `works`)
  }
  opsFailedChanged_.notify_all();
}

c10::scope_exit<std::function<void()>> Watchdog::handOnIfNeverFailed(Works& works) {
  // Where the break throws before it fails them (it does not, but a future's callback or an
  // allocation might), they fail here, so that opsOutside_ never stays up.
  return c10::make_scope_exit(std::function<void()>([this, &works] {
    if (works.empty()) {
      return;  // handed on by handOnFailed()
    }
    for (auto& work : works) {
      work->fail("the group's break failed before it failed this op");
    }
    handOnFailed(works);
  }));
}

void Watchdog::awaitOpsOutside() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!opsFailedChanged_.wait_for(lock, kBreakWait, [&] { return opsOutside_ == 0; })) {
    lock.unlock();  // logged without the lock: describing the group may call into it
    LOG(ERROR) << describeGroup().who() << " " << kBreakWait.count()
               << " s on, ops taken out by a break that lost the race are still not failed: "
                  "aborting anyway";
  }
}

void Watchdog::awaitOpsFailed() {
  bool failed = true;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (breaker_ == std::this_thread::get_id()) {
      return;  // from the break's own callbacks: it goes on once they return
    }
    failed = opsFailedChanged_.wait_for(lock, kBreakWait,
                                        [&] { return breaking_ == Breaking::OpsFailed; });
  }
  if (!failed) {  // logged without the lock: describing the group may call into it
    LOG(ERROR) << describeGroup().who()
               << " the group's break did not fail its ops in flight within " << kBreakWait.count()
               << " s (a future's callback that does not return?)";
  }
}

void Watchdog::failUntilTheirEnd(Works& works, const std::string& reason) {
  for (auto& work : works) {
    work->fail(reason);
    retire(*work);
  }
  // Their kernels after the communicator's still run once it is aborted: they are let go once
  // their end has passed (collectEnded()).
  std::lock_guard<std::mutex> lock(mutex_);
  append(failedRunning_, works);
}

void Watchdog::retire(Work& work) {
  RecorderClock clock;
  retire(work, clock);
}

void Watchdog::retireFailed(Work& work, const std::exception_ptr& error) {
  if (!work.markRetired()) {
    return;
  }
  health_->recorder().failed(work.info().traceId, describeException(error));
  stats_->ended(work.retrieveOpType(), /*succeeded=*/false, std::nullopt);
}

void Watchdog::retire(Work& work, RecorderClock& clock) {
  if (!work.markRetired()) {
    return;
  }
  if (work.isSuccess()) {
    std::optional<double> duration;
    try {
      duration = work.durationMs();
    } catch (...) {
      std::lock_guard<std::mutex> lock(timingFaultMutex_);
      timingFault_ = std::current_exception();  // reported by settle()
      timingFaulted_.store(true, std::memory_order_release);
    }
    health_->recorder().completed(work.info().traceId, duration, clock);
    stats_->ended(work.retrieveOpType(), /*succeeded=*/true, duration);
    if (hooks_->active()) {
      hooks_->completed(work.retrieveOpType(), work.getSequencenumber(), work.issuedAt(), duration);
    }
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
      try {
        communicator->abort();
      } catch (const std::exception& e) {  // the others must still be aborted
        LOG(ERROR) << describeGroup().who() << " aborting a communicator failed: " << e.what();
      }
    }
  });
}

void Watchdog::abortCommunicatorsBut(const std::vector<const Communicator*>& kept) {
  for (const auto& communicator : liveCommunicators()) {
    if (std::find(kept.begin(), kept.end(), communicator.get()) != kept.end()) {
      continue;
    }
    try {
      communicator->abort();
    } catch (const std::exception& e) {  // the others must still be aborted
      LOG(ERROR) << describeGroup().who() << " aborting a communicator failed: " << e.what();
    }
  }
}

bool Watchdog::finish(Clock::time_point deadline) { return finishOn({}, deadline); }

bool Watchdog::finishOn(const std::vector<const Communicator*>& communicators,
                        Clock::time_point deadline) {
  const auto counts = [&](const c10::intrusive_ptr<Work>& work) {
    return communicators.empty() || std::find(communicators.begin(), communicators.end(),
                                              work->communicator()) != communicators.end();
  };
  Backoff backoff(std::chrono::microseconds(100), std::chrono::microseconds(10000));
  while (!health_->broken()) {
    Works faulted;
    bool done = false;
    {
      RecorderClock clock;
      std::lock_guard<std::mutex> lock(mutex_);
      collectEnded(faulted, clock);
      done =
          std::none_of(inFlight_.ops().begin(), inFlight_.ops().end(), counts) && faulted.empty();
    }
    if (!faulted.empty()) {
      settle(faulted);
      continue;
    }
    if (done) {
      return true;
    }
    if (Clock::now() >= deadline) {
      return false;
    }
    backoff.pause();
  }
  return false;
}

std::vector<std::string> Watchdog::unfinished() {
  std::vector<std::string> ops;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& work : inFlight_.ops()) {
    ops.push_back(std::string(work->info().name) + " #" + std::to_string(work->info().seq));
  }
  return ops;
}

std::vector<std::string> Watchdog::closeCommunicators(Clock::time_point deadline) {
  const auto communicators = liveCommunicators();
  std::vector<std::string> notes;
  // Every finalize begins before any is waited for: a node's ranks finalize together.
  for (const auto& communicator : communicators) {
    try {
      communicator->beginClose();
    } catch (const std::exception& e) {
      notes.push_back(e.what());
    }
  }
  for (const auto& communicator : communicators) {
    try {
      if (std::string why = communicator->endClose(deadline); !why.empty()) {
        notes.push_back(std::move(why));
      }
    } catch (const std::exception& e) {
      notes.push_back(e.what());
    }
  }
  return notes;
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
  // In an order every member shares (abort and finalize are collective among a node's ranks).
  std::stable_sort(live.begin(), live.end(),
                   [](const auto& a, const auto& b) { return a->key() < b->key(); });
  return live;
}

void Watchdog::failInFlightOfBrokenGroup() {
  // The group is marked broken before its break has taken the ops in flight (it writes the
  // evidence first, which may take long), and the break may run on another thread (a caller's
  // wait(timeout)). Ops it has not taken yet fail here; if it has taken them, it is failing
  // them now, and this waits for that.
  Works stranded;
  bool taken = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stranded = inFlight_.takeAll();
    taken = breaking_ != Breaking::None;
  }
  failUntilTheirEnd(stranded, "the group was destroyed while it broke");
  if (taken) {
    awaitOpsFailed();
  }
}

size_t Watchdog::releaseAll(Clock::time_point deadline) {
  // Every op has ended (finish()) or failed (failInFlightOfBrokenGroup()) by now. Failed ops are
  // let go once their end has passed; the aborts have stopped what held it up.
  Backoff backoff(std::chrono::microseconds(100), std::chrono::microseconds(10000));
  while (true) {
    Works faulted;
    bool waiting = false;
    {
      RecorderClock clock;
      std::lock_guard<std::mutex> lock(mutex_);
      collectEnded(faulted, clock);
      waiting = !failedRunning_.empty();
    }
    if (!faulted.empty()) {
      settle(faulted);
    }
    if (!waiting || Clock::now() >= deadline) {
      break;
    }
    backoff.pause();
  }
  Works released;
  size_t kept = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    append(released, ended_);
    append(released, captured_);
    kept = failedRunning_.size();
  }
  if (kept > 0) {
    // Kept for good: freeing memory that a kernel still uses would corrupt what the caching
    // allocator hands out next.
    static auto* leakedMutex = new std::mutex();  // never destroyed, as what it guards
    static auto* leaked = new Works();
    std::lock_guard<std::mutex> leakedLock(*leakedMutex);
    std::lock_guard<std::mutex> lock(mutex_);
    append(*leaked, failedRunning_);
  }
  for (auto& work : released) {
    work->releaseTensors();
  }
  return kept;
}

}  // namespace streamnccl
