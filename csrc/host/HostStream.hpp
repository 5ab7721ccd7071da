#pragma once

#include "core/Task.hpp"
#include "host/Signal.hpp"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace streamnccl {

// The host path's internal stream, taking work as a CUDA stream does: items run in the order
// they were enqueued, each once the calls to Gloo that the items before it issued have
// completed; an op's task posts its calls and returns, and its settle (Device::afterCalls) runs
// once they are done. No thread is handed the work on the common path: an item runs on
// whichever thread finds the stream ready: the caller that enqueues it, or the thread that
// sees the call before it complete. For a call with a future (a collective) that is a caller
// in a plain wait() on an op of this stream with no other op queued (helpWait), whom the
// future wakes, as Gloo's thread wakes a waiter of gloo's own; else Gloo's thread, from the
// future, which so chains the ops queued. A call with no future
// (Gloo's sends and receives) completes once a thread waits for it: the caller's wait() where one
// comes, else the stream's worker, woken when the call has gone unwatched for a while (nudge), or
// at once for a waiter that will not wait in Gloo itself (a wait with a timeout, a sync op, the
// end). The worker, made at the first need, also runs the items that may wait (a task whose peers
// have not yet opened Gloo).
//
// Who holds the stream (Holder, under the lock):
//   Free    no thread runs an item. Items are queued only behind pending calls, whose
//           completion takes the stream: Free -> Running (the completing thread runs them) or
//           Free -> Handed (the front one may wait).
//   Running one thread runs items (runner_), until the queue is empty or a call is pending
//           (-> Free), or the front item may wait and it is not the worker (-> Handed).
//   Handed  the worker is woken to run the front item (-> Running, on the worker).
// An enqueue on a Free stream with nothing pending takes it (-> Running or Handed); a sync op
// (runInOrder) takes it once it is Free with nothing queued, whatever calls are pending.
class HostStream {
 public:
  enum class Kind {
    Quick,    // never waits: runs on any thread (posts, kernels, signals)
    MayWait,  // may wait (for peers to open Gloo): runs on the worker alone
  };

  HostStream() = default;
  // Runs everything enqueued (and waits for its calls), then joins the worker; on a thread
  // running the stream's item (its last owner let go there), leaves the rest to the threads
  // that drive it, which share its state.
  ~HostStream();
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Runs `item` on this thread where the stream is idle (Free, nothing queued or pending) and
  // the item may run here; else keeps it (take()) for the thread that finds the stream ready.
  void enqueue(Task item, Kind kind) { push(std::move(item), kind, /*op=*/false); }
  // As enqueue(), for an op's task, which posts calls: while one is queued, a waiter leaves
  // the calls to the thread that chains them (helpWait).
  void enqueueOp(Task task, Kind kind) { push(std::move(task), kind, /*op=*/true); }
  // Runs `task` on the calling thread once everything enqueued before it has run (its calls
  // may be pending), and returns when it has: a sync op posted in program order.
  void runInOrder(const Task& task);

  // How a Gloo call tells it has completed: its future (collectives), or only a wait on it,
  // which the worker makes (sends and receives).
  enum class Completion { Future, Wait };
  // From an item running on this stream: later items wait until `call` has completed. Its
  // failure goes to the settle (afterCalls).
  void awaitCall(const c10::intrusive_ptr<c10d::Work>& call, Completion completion);
  // Later items wait until `signal` is set (an event recorded on another stream).
  void enqueueWaitFor(std::shared_ptr<Signal> signal);
  // From an item running on this stream: `settle` runs next, once the calls awaited so far
  // have completed, given the first one's failure (or null); at once where they have.
  void afterCalls(Settle settle);
  // Ends the waits for calls without a future (Gloo's abortWaitSend/Recv): they fail. Calls
  // with a future end when Gloo's own work does.
  void abortCalls();
  // For a waiter until `point` (an event recorded on this stream) has passed: Passed where it
  // has. Else waits here for a call that no thread waits for yet and completes it (the items
  // it held back run on this thread): Completed. That is the oldest call without a future,
  // waited for until it completes or a break ends the wait (abortCalls); else, with no op's
  // task queued, the oldest with a future no other waiter has claimed, waited for up to
  // `slice`, then left to its future (StillWaiting). Else the waiter parks on the stream up to
  // `slice`, woken once its point has passed (Passed) or a call without a future is posted,
  // which it then waits for (Completed); StillWaiting where neither came. So with ops' tasks
  // queued, the thread completing each call posts the next one's at once, as Gloo's thread chains
  // gloo's ops, where a waiter that took the call over would cost a wake between the two threads
  // for every op; and a call without a future that another thread posts (an op's task it runs) is
  // waited for at once.
  enum class Helped { Passed, Completed, StillWaiting };
  Helped helpWait(const Signal& point, std::chrono::milliseconds slice);
  // Wakes the worker to wait for the calls without a future that no thread has waited for
  // since `grace` ago.
  void nudge(std::chrono::milliseconds grace);

  // A Gloo call's failure, a timeout as a TimeoutError (Gloo says so only in its message).
  static std::exception_ptr glooFailure(std::exception_ptr cause);
  // Waits for a Gloo call: its failure, or null once it has completed. `aborted`, where given,
  // is set where abortCalls() ended the wait of a send or a receive.
  static std::exception_ptr waitFor(const c10::intrusive_ptr<c10d::Work>& call,
                                    bool* aborted = nullptr);
  // Waits here for a call posted by an item of this stream that must see it through itself (a
  // recv from any source learns its sender so), as abortCalls() can end: its failure, or null.
  std::exception_ptr waitWatched(const c10::intrusive_ptr<c10d::Work>& call);

 private:
  enum class Holder { Free, Running, Handed };
  struct Item {
    std::function<void()> run;
    Kind kind;
    bool op;  // an op's task (enqueueOp), rather than a step of the stream's own
  };
  // A call without a future, waiting for a thread to wait for it.
  struct Unwatched {
    c10::intrusive_ptr<c10d::Work> call;
    std::chrono::steady_clock::time_point since;
  };
  // A call with a future, until its future completes, and who completes it (under the lock):
  //   Open     its future's callback will: Open -> Claimed (a waiter claims it, helpWait)
  //   Claimed  the waiter will, once told: Claimed -> Told (the future's callback records its
  //            failure and wakes it), or -> Open (the waiter's slice passed first)
  //   Told     the waiter completes it on its own thread
  struct Posted {
    enum class Claim { Open, Claimed, Told };
    Claim claim = Claim::Open;
  };
  // Shared with the worker, the calls' callbacks and whichever thread drives the stream: the
  // last owner may let go of the HostStream inside an item.
  struct State {
    std::mutex mutex;
    std::condition_variable wake;     // the worker: an item handed, a wait to make, a stop
    std::condition_variable changed;  // the stream went Free (runInOrder, the destructor)
    std::deque<Item> items;
    int opsQueued = 0;  // of the items, ops' tasks
    Holder holder = Holder::Free;
    std::thread::id runner;
    int pending = 0;                      // calls and signals awaited, not yet completed
    std::exception_ptr failure;           // of the calls awaited since the last settle
    std::condition_variable claimedDone;  // a claimed call's future completed (helpWait)
    // Waiters parked (helpWait), by the point each waits for; woken once it has passed, or a
    // call without a future is posted.
    std::vector<const Signal*> parked;
    std::condition_variable parkedWake;
    std::deque<std::shared_ptr<Posted>> posted;  // calls with a future, not yet completed
    std::deque<Unwatched> waits;        // calls without a future that no thread waits for yet
    std::atomic<bool> anyWaits{false};  // !waits.empty(), for nudge()'s look without the lock
    std::vector<c10::intrusive_ptr<c10d::Work>> watched;  // those a thread waits for now
    bool aborted = false;
    bool stopping = false;
    bool orphaned = false;  // the HostStream went on a thread driving it: no one joins the worker
    std::thread worker;     // made at the first need (startWorker)
    std::atomic<std::thread::id> workerId{};

    bool drained() const { return holder == Holder::Free && items.empty() && pending == 0; }
    // Under the lock: the first of the calls' failures since the last settle is the one kept.
    void keepFirst(std::exception_ptr failed) {
      if (failed && !failure) {
        failure = std::move(failed);
      }
    }
  };
  using Lock = std::unique_lock<std::mutex>;

  void push(Task item, Kind kind, bool op);
  // With the lock held, the stream Free and nothing queued or only behind pending calls: wakes
  // whoever waits for that (runInOrder, the destructor, an orphaned stream's worker).
  static void wentFree(State& s);
  // With the stream held by this thread (Running): runs items until it must let go.
  static void drive(const std::shared_ptr<State>& state, Lock& lock);
  // A call or signal awaited has completed, with `failure` (a call's) or none.
  static void completed(const std::shared_ptr<State>& state, std::exception_ptr failure);
  // With the stream Free, nothing pending and an item queued: this thread takes it.
  static void take(const std::shared_ptr<State>& state, Lock& lock);
  // With the lock held and the stream Free: this thread holds it, runs `task` without the lock,
  // then the items queued meanwhile (drive).
  static void runHere(const std::shared_ptr<State>& state, Lock& lock, const Task& task);
  static void startWorker(const std::shared_ptr<State>& state);  // with the lock held
  static void workerLoop(const std::shared_ptr<State>& state);
  // With the lock held and a call in `waits`: takes the oldest and waits for it on this
  // thread (without the lock), then completes it.
  static void watchOldest(const std::shared_ptr<State>& state, Lock& lock);
  // With the lock held: claims `posted`, a call no thread has claimed, and waits up to `slice`
  // for its future; completes it where it has completed, else lets go of the claim.
  static Helped claim(const std::shared_ptr<State>& state, Lock& lock,
                      std::shared_ptr<Posted> posted, std::chrono::milliseconds slice);
  // With the lock held: waits up to `slice` for `point` to pass, or for a call without a
  // future to wait for (then waits for it).
  static Helped park(const std::shared_ptr<State>& state, Lock& lock, const Signal& point,
                     std::chrono::milliseconds slice);
  // With the lock held, at each turn of drive() (an item may have set a point): wakes the
  // parked waiters whose point has passed, and takes their points off the list.
  static void wakeParked(State& s);
  // A posted call's future completed: its claimer is told, else this thread completes it.
  static void futureCompleted(const std::shared_ptr<State>& state,
                              const std::shared_ptr<Posted>& posted, std::exception_ptr failure);
  // Waits for `call` among the watched (abortCalls() ends it); an aborted one is kept for good.
  static std::exception_ptr waitWatchedOn(const std::shared_ptr<State>& state,
                                          const c10::intrusive_ptr<c10d::Work>& call);

  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace streamnccl
