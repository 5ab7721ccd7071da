#include "host/HostStream.hpp"

#include "core/Errors.hpp"
#include "core/GroupThreads.hpp"

#include <c10/util/Exception.h>
#include <c10/util/thread_name.h>

#include <algorithm>

namespace streamnccl {

std::exception_ptr HostStream::glooFailure(std::exception_ptr cause) {
  const std::string what = describeException(cause);
  if (what.find("Timed out") == std::string::npos) {
    return cause;
  }
  try {
    throwTimeoutError(what);
  } catch (...) {
    return std::current_exception();
  }
}

HostStream::~HostStream() {
  State& s = *state_;
  Lock lock(s.mutex);
  s.stopping = true;
  const auto self = std::this_thread::get_id();
  if ((s.holder == Holder::Running && s.runner == self) || s.workerId.load() == self) {
    // Its last owner let go inside one of its items: waiting here would wait for ourselves.
    // The threads driving it finish what is left; a worker ends once it is all done.
    s.orphaned = true;
    if (s.worker.joinable()) {
      s.worker.detach();
    }
    if (!s.waits.empty()) {
      startWorker(state_);  // detached at once: no one else may ever wait for them
    }
    s.wake.notify_all();
    return;
  }
  if (!s.waits.empty()) {
    startWorker(state_);  // no one else may ever wait for them
    s.wake.notify_one();
  }
  s.changed.wait(lock, [&] { return s.drained(); });
  s.wake.notify_all();
  std::thread worker = std::move(s.worker);
  lock.unlock();
  if (worker.joinable()) {
    worker.join();
  }
}

void HostStream::startWorker(const std::shared_ptr<State>& state) {
  State& s = *state;
  if (s.worker.joinable() || s.workerId.load() != std::thread::id()) {
    return;  // made already (joined only by the destructor, once all is done)
  }
  s.worker = std::thread([state] {
    c10::setThreadName("streamnccl-host");  // what py-spy, gdb and top show
    markGroupThread();
    workerLoop(state);
  });
  // Before the thread can look: it waits for the lock this caller holds.
  s.workerId = s.worker.get_id();
  if (s.orphaned) {
    s.worker.detach();
  }
}

void HostStream::push(Task item, Kind kind, bool op) {
  const auto state = state_;  // a copy: the last owner may let go of the stream inside the item
  State& s = *state;
  Lock lock(s.mutex);
  const bool idle = s.holder == Holder::Free && s.pending == 0 && s.items.empty();
  if (idle && (kind == Kind::Quick || std::this_thread::get_id() == s.workerId.load())) {
    runHere(state, lock, item);  // the common case of an async op: the item is never kept
    return;
  }
  // Kept outside the lock, which the calls' completions and the watchdog's looks take.
  lock.unlock();
  auto kept = std::move(item).take();
  lock.lock();
  s.items.push_back(Item{std::move(kept), kind, op});
  s.opsQueued += op ? 1 : 0;
  if (s.holder == Holder::Free && s.pending == 0 && s.items.size() == 1) {
    take(state, lock);  // idle again meanwhile, or the item may wait: handed to the worker
  }
}

void HostStream::enqueueWaitFor(std::shared_ptr<Signal> signal) {
  // An item that makes the stream wait, rather than one that waits itself.
  std::weak_ptr<State> weak = state_;
  enqueue(
      [weak, signal = std::move(signal)] {
        auto state = weak.lock();
        if (!state) {
          return;
        }
        {
          std::lock_guard<std::mutex> lock(state->mutex);
          ++state->pending;
        }
        signal->onSet([state] { completed(state, nullptr); });
      },
      Kind::Quick);
}

void HostStream::take(const std::shared_ptr<State>& state, Lock& lock) {
  State& s = *state;
  if (s.items.front().kind == Kind::MayWait && std::this_thread::get_id() != s.workerId.load()) {
    s.holder = Holder::Handed;
    startWorker(state);
    s.wake.notify_one();
    return;
  }
  s.holder = Holder::Running;
  s.runner = std::this_thread::get_id();
  drive(state, lock);
}

void HostStream::wentFree(State& s) {
  s.changed.notify_all();
  if (s.stopping && s.drained()) {
    s.wake.notify_all();  // a worker left to end once all is done (an orphaned stream's)
  }
}

void HostStream::drive(const std::shared_ptr<State>& state, Lock& lock) {
  State& s = *state;
  while (true) {
    wakeParked(s);  // the item that ran last may have set a waiter's point
    if (s.pending > 0 || s.items.empty()) {
      s.holder = Holder::Free;
      wentFree(s);
      return;
    }
    if (s.items.front().kind == Kind::MayWait && std::this_thread::get_id() != s.workerId.load()) {
      s.holder = Holder::Handed;
      startWorker(state);
      s.wake.notify_one();
      return;
    }
    Item item = std::move(s.items.front());
    s.items.pop_front();
    s.opsQueued -= item.op ? 1 : 0;
    lock.unlock();
    item.run();          // an item never throws (an op's task catches what its op meets)
    item.run = nullptr;  // what a kept item held goes before the next one runs, outside the lock
    lock.lock();
  }
}

void HostStream::completed(const std::shared_ptr<State>& state, std::exception_ptr failure) {
  State& s = *state;
  Lock lock(s.mutex);
  s.keepFirst(std::move(failure));
  if (--s.pending > 0 || s.holder != Holder::Free) {
    return;  // the thread running the stream's items sees it at its next look
  }
  if (s.items.empty()) {
    wentFree(s);
    return;
  }
  // On a thread of Gloo's, the items run here are the group's work: their futures' callbacks
  // may let go of the group, whose teardown must then not run on this thread.
  GroupThreadScope groupWork;
  take(state, lock);
}

void HostStream::runInOrder(const Task& task) {
  const auto& state = state_;
  State& s = *state;
  Lock lock(s.mutex);
  const auto self = std::this_thread::get_id();
  if (s.holder == Holder::Running && s.runner == self) {
    // Called from an item (a future callback issuing a sync op): waiting for the queue would
    // wait for ourselves, so it runs inline. Its place among ops queued behind that item can
    // then differ from rank to rank, as on the worker before: a callback should issue async
    // ops, which queue in order.
    lock.unlock();
    task();
    return;
  }
  while (s.holder != Holder::Free || !s.items.empty()) {
    if (!s.waits.empty()) {  // what is queued may wait for them: the worker waits, not us
      startWorker(state);
      s.wake.notify_one();
    }
    s.changed.wait(lock);
  }
  runHere(state, lock, task);
}

void HostStream::runHere(const std::shared_ptr<State>& state, Lock& lock, const Task& task) {
  State& s = *state;
  s.holder = Holder::Running;
  s.runner = std::this_thread::get_id();
  lock.unlock();
  task();
  lock.lock();
  drive(state, lock);  // what was enqueued meanwhile, once its calls allow
}

void HostStream::awaitCall(const c10::intrusive_ptr<c10d::Work>& call, Completion completion) {
  const auto& state = state_;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  if (completion == Completion::Future) {
    try {
      future = call->getFuture();
    } catch (const c10::Error&) {
      completion = Completion::Wait;  // a Work of Gloo's without one (an op on no elements)
    }
  }
  auto posted = future ? std::make_shared<Posted>() : nullptr;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    // Pushed before it is counted: a push that throws leaves no count that nothing ends.
    if (completion == Completion::Future) {
      state->posted.push_back(posted);  // may be claimed by a waiter from now
      ++state->pending;
    } else {
      // Waited for by whoever comes first: the op's wait(), else the worker (nudge).
      state->waits.push_back(Unwatched{call, std::chrono::steady_clock::now()});
      ++state->pending;
      state->anyWaits.store(true, std::memory_order_release);
      if (!state->parked.empty()) {
        state->parkedWake.notify_all();  // a parked waiter waits for it, not the worker
      }
      if (state->aborted) {  // posted as the break aborted the others: ended at once too
        startWorker(state);
        state->wake.notify_one();
      }
      return;
    }
  }
  // Runs at once where the call has completed already (on this item's thread), else on the
  // Gloo thread completing it.
  future->addCallback([state, posted](c10::ivalue::Future& done) {
    // On Gloo's thread, outside its guard: what escapes here would end the process.
    try {
      futureCompleted(state, posted, done.hasError() ? glooFailure(done.exception_ptr()) : nullptr);
    } catch (...) {
      TORCH_WARN("streamnccl: the host stream could not go on after a Gloo call: ",
                 describeException(std::current_exception()));
    }
  });
}

void HostStream::futureCompleted(const std::shared_ptr<State>& state,
                                 const std::shared_ptr<Posted>& posted,
                                 std::exception_ptr failure) {
  bool claimed = false;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    auto& all = state->posted;
    all.erase(std::find(all.begin(), all.end(), posted));
    claimed = posted->claim == Posted::Claim::Claimed;
    if (claimed) {
      posted->claim = Posted::Claim::Told;
      state->keepFirst(std::move(failure));  // now, so that the first to fail stays the first
    }
  }
  if (!claimed) {
    completed(state, std::move(failure));
    return;
  }
  // Its waiter goes on from here on its own thread, as gloo's waiter does once Gloo's thread
  // is done with the call: this thread's part ends with the wake, made outside the lock that
  // the waiter takes first.
  state->claimedDone.notify_all();
}

void HostStream::afterCalls(Settle settle) {
  const auto& state = state_;
  State& s = *state;
  Lock lock(s.mutex);
  if (s.pending == 0) {
    auto failure = std::exchange(s.failure, nullptr);
    lock.unlock();
    settle(failure);
    return;
  }
  // Kept without the lock, which the calls' completions take: this item holds the stream, so
  // nothing runs ahead of the settle meanwhile.
  lock.unlock();
  auto kept = std::move(settle).take();
  lock.lock();
  // Next, before whatever was enqueued while this item ran: the item's own end.
  std::weak_ptr<State> weak = state;
  s.items.push_front(Item{[weak, settle = std::move(kept)] {
                            std::exception_ptr failure;
                            if (auto held = weak.lock()) {
                              std::lock_guard<std::mutex> guard(held->mutex);
                              failure = std::exchange(held->failure, nullptr);
                            }
                            settle(failure);
                          },
                          Kind::Quick, /*op=*/false});
}

namespace {

// Ends a wait for a Gloo send or receive (abortWaitSend/Recv). A call of another kind (a Gloo
// Work without a future, waited for all the same) cannot be: it ends as Gloo ends it.
void abortWait(const c10::intrusive_ptr<c10d::Work>& call) {
  try {
    call->abort();
  } catch (const c10::Error&) {
  }
}

// Gloo still has an aborted send or receive posted: the pair may yet write into its buffer, or
// read from it, until Gloo closes the connection. Its Work, which holds the tensor, is kept
// for the process's life, as a failed CUDA op's tensors are whose kernels never pass.
void keepForGood(c10::intrusive_ptr<c10d::Work> call) {
  static auto* kept = new std::vector<c10::intrusive_ptr<c10d::Work>>();  // never freed
  static std::mutex mutex;
  TORCH_WARN_ONCE(
      "streamnccl: a send or a receive that its group's break aborted is still posted in "
      "Gloo; its buffer is kept for the rest of the process, as Gloo may yet use it");
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(call));
}

}  // namespace

void HostStream::abortCalls() {
  const auto& state = state_;
  State& s = *state;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.aborted = true;
  for (auto& unwatched : s.waits) {
    abortWait(unwatched.call);
  }
  for (auto& call : s.watched) {
    abortWait(call);
  }
  if (!s.waits.empty()) {  // ended at once, by the worker, rather than at the next look
    startWorker(state);
    s.wake.notify_one();
  }
}

std::exception_ptr HostStream::waitWatched(const c10::intrusive_ptr<c10d::Work>& call) {
  return waitWatchedOn(state_, call);
}

std::exception_ptr HostStream::waitWatchedOn(const std::shared_ptr<State>& state,
                                             const c10::intrusive_ptr<c10d::Work>& call) {
  State& s = *state;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.watched.push_back(call);
    if (s.aborted) {
      abortWait(call);
    }
  }
  bool aborted = false;
  auto failure = waitFor(call, &aborted);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.watched.erase(std::find(s.watched.begin(), s.watched.end(), call));
  if (aborted) {
    keepForGood(call);
  }
  return failure;
}

HostStream::Helped HostStream::helpWait(const Signal& point, std::chrono::milliseconds slice) {
  const auto state = state_;
  Lock lock(state->mutex);
  if (point.isSet()) {
    // Looked at under the lock: a later op's calls are posted only after its point is set and
    // the stream's next item taken under this lock, so none of them is claimed for it.
    return Helped::Passed;
  }
  if (!state->waits.empty()) {
    watchOldest(state, lock);
    return Helped::Completed;
  }
  if (state->opsQueued == 0) {
    auto open = std::find_if(state->posted.begin(), state->posted.end(), [](const auto& posted) {
      return posted->claim == Posted::Claim::Open;
    });
    if (open != state->posted.end()) {
      return claim(state, lock, *open, slice);  // a copy: the call leaves `posted` meanwhile
    }
  }
  return park(state, lock, point, slice);
}

HostStream::Helped HostStream::park(const std::shared_ptr<State>& state, Lock& lock,
                                    const Signal& point, std::chrono::milliseconds slice) {
  State& s = *state;
  s.parked.push_back(&point);
  s.parkedWake.wait_for(lock, slice, [&] { return point.isSet() || !s.waits.empty(); });
  // Still there where the slice ran out, or a call woke it (wakeParked takes a passed point).
  if (auto mine = std::find(s.parked.begin(), s.parked.end(), &point); mine != s.parked.end()) {
    s.parked.erase(mine);
  }
  if (point.isSet()) {
    return Helped::Passed;
  }
  if (!s.waits.empty()) {
    watchOldest(state, lock);
    return Helped::Completed;
  }
  return Helped::StillWaiting;
}

void HostStream::wakeParked(State& s) {
  // A waiter is woken once: its point leaves the list as it is woken, so the items that run
  // before it takes the lock again wake no one for it.
  const auto passed = std::remove_if(s.parked.begin(), s.parked.end(),
                                     [](const Signal* point) { return point->isSet(); });
  if (passed != s.parked.end()) {
    s.parked.erase(passed, s.parked.end());
    s.parkedWake.notify_all();
  }
}

HostStream::Helped HostStream::claim(const std::shared_ptr<State>& state, Lock& lock,
                                     std::shared_ptr<Posted> posted,
                                     std::chrono::milliseconds slice) {
  State& s = *state;
  posted->claim = Posted::Claim::Claimed;
  if (!s.claimedDone.wait_for(lock, slice, [&] { return posted->claim == Posted::Claim::Told; })) {
    posted->claim = Posted::Claim::Open;  // its future's callback, still to come, completes it
    return Helped::StillWaiting;
  }
  lock.unlock();
  completed(state, nullptr);  // its failure was recorded when it was told
  lock.lock();
  return Helped::Completed;
}

void HostStream::nudge(std::chrono::milliseconds grace) {
  const auto& state = state_;
  if (!state->anyWaits.load(std::memory_order_acquire)) {
    return;  // the common case, asked of ops in flight at every launch: no lock
  }
  std::lock_guard<std::mutex> lock(state->mutex);
  if (!state->waits.empty() &&
      state->waits.front().since + grace <= std::chrono::steady_clock::now()) {
    startWorker(state);
    state->wake.notify_one();
  }
}

void HostStream::watchOldest(const std::shared_ptr<State>& state, Lock& lock) {
  auto call = std::move(state->waits.front().call);
  state->waits.pop_front();
  state->anyWaits.store(!state->waits.empty(), std::memory_order_release);
  lock.unlock();
  auto failure = HostStream::waitWatchedOn(state, call);
  call.reset();
  completed(state, std::move(failure));
  lock.lock();
}

std::exception_ptr HostStream::waitFor(const c10::intrusive_ptr<c10d::Work>& call, bool* aborted) {
  try {
    if (call->wait()) {
      return nullptr;
    }
  } catch (...) {
    return glooFailure(std::current_exception());
  }
  // Gloo's wait for a send or receive returns false once abort() ended it: it did not complete.
  if (aborted) {
    *aborted = true;
  }
  return makeDistBackendError("the Gloo call was aborted (its group broke) before it completed");
}

void HostStream::workerLoop(const std::shared_ptr<State>& state) {
  State& s = *state;
  Lock lock(s.mutex);
  while (true) {
    s.wake.wait(lock, [&] {
      return !s.waits.empty() || s.holder == Holder::Handed || (s.stopping && s.drained());
    });
    if (!s.waits.empty()) {
      watchOldest(state, lock);
      continue;
    }
    if (s.holder == Holder::Handed) {
      s.holder = Holder::Running;
      s.runner = std::this_thread::get_id();
      drive(state, lock);
      continue;
    }
    return;  // stopping, and all done
  }
}

}  // namespace streamnccl
