#pragma once

// One ncclComm_t through its life. It connects in the background from construction: the member
// of lowest rank makes the unique id and publishes it through the Store, every member inits a
// non-blocking communicator and polls it until NCCL says it is ready, which happens once all
// members have called init. Nothing holds a caller while that happens, so a rank's first
// contact with one peer never waits on that peer's first contact with another (a ring of
// first sends would otherwise wait in a circle); a caller that needs the communicator waits
// for it alone, and the group's timeout or abort() ends that wait.
//
// Every NCCL call is a Use: it waits until connected, is refused once aborted or closed, and,
// since the communicator is non-blocking, polls a call that returned ncclInProgress until it
// has finished before anything else is issued (an event recorded earlier would pass before
// the call's kernel). abort() waits for the Uses in progress to end (polling loops see the
// abort at once) before ncclCommAbort frees the communicator, so no call ever uses a freed one.
//
// At the group's end it is closed in order: ncclCommFinalize, polled until NCCL has flushed
// the communicator's work on every member, then ncclCommDestroy; an abort only when that does
// not finish by the deadline. A communicator with work captured into a CUDA graph is left
// alone at close: NCCL would wait for the graph's destruction, which may never come. Aborted,
// it is aborted on a thread of its own: ncclCommAbort stops its kernels at once, and only
// then waits for the graphs.

#include "core/Options.hpp"
#include "cuda/CudaApi.hpp"
#include "cuda/NcclApi.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace streamnccl {

class NcclConnection {
 public:
  struct Settings {
    std::shared_ptr<NcclApi> nccl;
    std::shared_ptr<CudaApi> cuda;
    c10::intrusive_ptr<c10d::Store> store;
    c10::Device device;
    int size = 0;                       // members
    int rank = 0;                       // this one's rank among them
    bool makesId = false;               // the member of lowest group rank
    std::string idKey;                  // where the unique id is published
    std::string who;                    // "[streamnccl rank r/n cuda:d]", for messages
    std::chrono::milliseconds timeout;  // for connecting, and for a call in progress
    Options::NcclConfig config;         // what the group asks of NCCL (checked already)
    std::string name;                   // NCCL's name for it (ncclConfig_t::commName), or ""
  };

  // What a connection made from another is made from, instead of a unique id and init:
  // ncclCommShrink or ncclCommSplit of the parent's communicator.
  struct ChildOf {
    std::shared_ptr<NcclConnection> parent;
    enum class How { Shrink, Split };
    How how = How::Shrink;
    std::vector<int> excluded;   // Shrink: the parent's communicator ranks left out, sorted
    bool abortInFlight = false;  // Shrink: NCCL_SHRINK_ABORT, the parent's operations end first
    // Split: this member's color (NCCL_SPLIT_NOCOLOR: it takes part, and makes nothing) and
    // key, its rank's order in the new one.
    int color = 0;
    int key = 0;
    // A key of `settings.store`, this shrink's or split's alone: a member that gives up writes
    // why there, and the others, which would otherwise wait for it until their timeout, end too.
    std::string failedKey;
  };
  // Starts connecting, on a thread that keeps the connection alive until it has settled.
  static std::shared_ptr<NcclConnection> open(Settings settings);
  // Starts making the communicator from `origin.parent`'s (ncclCommShrink or ncclCommSplit), on
  // a thread as open() does; every other member of the parent does the same (the excluded of
  // a shrink aside). `settings.idKey` only names it. NCCL makes it on a thread of its own, tied
  // to the parent: the parent stays held, and its state polled, until that is done; one that
  // does not end in time (or whose parent is aborted meanwhile) ends with the parent's abort,
  // the only way to stop NCCL's thread. A split with NCCL_SPLIT_NOCOLOR connects to nothing:
  // it is connected once the parent's members have all split, and is then done with.
  static std::shared_ptr<NcclConnection> fromParent(Settings settings, ChildOf origin);
  // Connected, neither aborted nor closed, and with no asynchronous error: a communicator
  // NCCL can still shrink.
  bool live();
  // Closes the communicator (see close()) unless it was closed or aborted already.
  ~NcclConnection();
  NcclConnection(const NcclConnection&) = delete;
  NcclConnection& operator=(const NcclConnection&) = delete;

  // Runs `callback` once connecting has ended (connected, failed or aborted): now if it has,
  // else on the connecting thread.
  void whenSettled(std::function<void()> callback);
  // Blocks until connected; raises DistBackendError if connecting failed or was aborted.
  void waitConnected();

  class Use {
   public:
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ncclComm_t comm() const { return comm_; }
    // Raises DistBackendError naming `call` unless `result` is success; polls a result of
    // ncclInProgress until the call has finished.
    void check(const char* call, ncclResult_t result) const;

   private:
    friend class NcclConnection;
    Use(NcclConnection& connection, ncclComm_t comm, bool counted)
        : connection_(connection), comm_(comm), counted_(counted) {}
    NcclConnection& connection_;
    const ncclComm_t comm_;
    const bool counted_;  // taken without the lock (fastUses_), not in uses_
  };
  // Waits until connected, then holds the communicator for one call (see above).
  Use use(const char* call);
  // The same hold, taken and given back by hand: across an NCCL group, whose calls NCCL keeps
  // on the calling thread until ncclGroupEnd, so that abort() waits for the group to end.
  void acquire(const char* call);
  void release() { endUse(); }
  // As Use::check, for a caller that holds the communicator through acquire().
  void checkHeld(const char* call, ncclResult_t result);

  // Aborts the communicator (or the connecting) for good; returns without waiting for peers.
  // Only its group's break calls it (Watchdog.hpp's rule), or the connection itself for a
  // communicator no op has used (still connecting, or being closed after its ops ended).
  void abort();
  // How this connection asks its group to break (Communicator::setBreakRequest).
  void setBreakRequest(std::function<void(const std::string&)> request);
  // Closing in two steps (see Communicator::beginClose): beginClose() waits for a call in
  // progress and starts finalizing; endClose() waits until that is done (by `deadline`) and
  // destroys the communicator. It is aborted instead when that does not finish in time, or
  // fails, or when it is still connecting, and endClose() says why (empty otherwise). One
  // with work captured into a CUDA graph is left alone, and endClose() says so.
  void beginClose();
  std::string endClose(std::chrono::steady_clock::time_point deadline);
  // Work on the communicator was captured into a CUDA graph.
  void noteCaptured();
  // Its owner lets go: a connection still being made is aborted, since nobody will use it.
  void abandon();
  // The communicator's asynchronous error, described; empty when there is none (or it is not
  // connected, or aborted).
  std::string asyncError();

  const std::string& who() const { return settings_.who; }
  NcclApi& nccl() const { return *settings_.nccl; }

 private:
  // A connection has two lifecycles, each one enum with its legal moves written below and
  // asserted at every change (moveTo()).
  //
  // Connecting, the connecting thread's: Connecting -> Connected | Failed, once. settled_ is
  // set after that, once the callbacks waiting for it have run (a lane's gate is open by then).
  enum class State { Connecting, Connected, Failed };
  // Its end, its group's close or an abort (any thread's). Uses are taken only while Open (and
  // Connected). Aborting is reached from every state but the abort's own: only its group's break
  // aborts a communicator whose ops may still run (Watchdog.hpp); the connection itself aborts
  // one no op uses (still connecting, abandoned) or whose ops have all ended (a finalize that
  // failed or timed out at close, the destructor).
  enum class End : uint8_t {
    Open,              // neither closed nor aborted
    Closing,           // beginClose(): no new use; waiting for the uses in progress
    CloseByAbort,      // closed while connecting or never connected: endClose() aborts it
    Finalizing,        // ncclCommFinalize called: endClose() polls it, then destroys
    Destroying,        // endClose() has taken the finalized communicator over
    Destroyed,         // ncclCommDestroy called (comm_ is null)
    LeftForGraphs,     // closed with work captured into a CUDA graph: left to the process's end
    Aborting,          // abort(): waits for the uses in progress, then ncclCommAbort
    Aborted,           // ncclCommAbort returned, or there was nothing left to abort
    AbortLeftRunning,  // ncclCommAbort runs on a thread of its own (work on it was captured)
  };
  // The legal moves of End, from -> to. Every one not listed is a defect (asserted).
  static constexpr std::pair<End, End> kEndMoves[] = {
      {End::Open, End::Closing},
      {End::Open, End::CloseByAbort},
      {End::Open, End::LeftForGraphs},
      {End::Open, End::Aborting},
      {End::Closing, End::Finalizing},
      {End::Closing, End::Aborting},
      {End::CloseByAbort, End::Aborting},
      {End::Finalizing, End::Destroying},
      {End::Finalizing, End::Aborting},
      {End::Destroying, End::Destroyed},
      {End::Destroying, End::Aborting},
      {End::Destroyed, End::Aborting},
      {End::LeftForGraphs, End::Aborting},
      {End::Aborting, End::Aborted},
      {End::Aborting, End::AbortLeftRunning},
  };
  static constexpr std::pair<State, State> kStateMoves[] = {
      {State::Connecting, State::Connected},
      {State::Connecting, State::Failed},
  };
  // With mutex_ held: the state moves to `to`, which must be a legal move; usable_ follows.
  void moveTo(State to);
  void moveTo(End to);
  // With mutex_ held: abort() has been called (Aborting or after).
  bool aborting() const {
    return end_ == End::Aborting || end_ == End::Aborted || end_ == End::AbortLeftRunning;
  }

  NcclConnection(Settings settings, std::optional<ChildOf> childOf)
      : settings_(std::move(settings)), childOf_(std::move(childOf)) {}
  void connect();
  // connect()'s first step for a new communicator: a non-blocking one from a unique id;
  // returns NCCL's result (ncclInProgress until it is ready).
  ncclResult_t initRank(ncclComm_t* comm, std::chrono::steady_clock::time_point deadline);
  // The ncclConfig_t of every communicator this connection makes: non-blocking, with the
  // group's settings and name. Its net name points into settings_ (NCCL copies it).
  ncclConfig_t ncclConfig() const;
  // connect()'s first step for one made from a parent (childOf_): returns once NCCL has made
  // it, or failed to, with its result; raises, having ended NCCL's making of it, on a timeout,
  // an abort, or another member giving up.
  ncclResult_t makeFromParent(ncclComm_t* comm, std::chrono::steady_clock::time_point deadline);
  // The parent's NCCL call that makes it: ncclCommShrink or ncclCommSplit.
  ncclResult_t callParent(ncclComm_t parentComm, ncclComm_t* into);
  // Ends a shrink or split that failed or is still in progress: the parent's group breaks
  // (its ops in flight fail, then its communicators are aborted, which ends NCCL's making of
  // this one and clears the parent's link to this one's abort flag), and only then is what
  // NCCL made freed. `why` says what failed, for the parent's group.
  void endChildInProgress(ncclComm_t* into, const std::string& why);
  // The parent's group breaks with `why`, or the parent is aborted where no group watches it.
  void breakParent(const std::string& why);
  // The reason another member gave up this shrink or split; empty when none has.
  std::string childGivenUp() const;
  // What connect() names its NCCL call in messages.
  const char* makingCall() const;
  bool abortedNow() const;
  // Blocks (up to a grace period) until an abort() under way has freed the communicator;
  // false when that could not be seen (it is freed on a thread of its own, or slowly, or
  // was never aborted).
  bool waitAbortReturned();
  ncclUniqueId exchangeId(std::chrono::steady_clock::time_point deadline);
  // Polls ncclCommGetAsyncError until it is no longer ncclInProgress; returns the result.
  // While making a child of the parent's communicator, the parent's abort and another
  // member's giving up end it too.
  ncclResult_t pollUntilSettled(ncclComm_t comm, const char* call,
                                std::chrono::steady_clock::time_point deadline,
                                bool ofParentMakingChild = false) const;
  // Writes why this shrink or split failed where the other members look (ChildOf::failedKey).
  void tellMembersChildFailed(const std::exception_ptr& failure);
  [[noreturn]] void raise(const std::string& reason) const;
  // acquire(), with mutex_ held by `lock`.
  void acquire(const char* call, std::unique_lock<std::mutex>& lock);
  void endUse();
  // The lock-free use's end (use()).
  void endCountedUse();
  // With mutex_ held: usable_ from the states, after each change of them (or of statePolls_).
  void noteUsable();
  // With mutex_ held: no use, counted either way, is in progress.
  bool noUseInProgress() const;
  void settle(State state, std::exception_ptr failure);

  const Settings settings_;
  const std::optional<ChildOf> childOf_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  State state_ = State::Connecting;
  bool settled_ = false;  // see State
  std::exception_ptr failure_;
  End end_ = End::Open;
  bool captured_ = false;                 // work on it was captured into a CUDA graph
  ncclResult_t finalized_ = ncclSuccess;  // ncclCommFinalize's result (Finalizing)
  ncclComm_t comm_ = nullptr;             // null again once destroyed
  int uses_ = 0;
  // Connected, and neither aborted nor closed (noteUsable()); read by use() without the lock.
  std::atomic<bool> usable_{false};
  // Uses taken without the lock because usable_ was set; abort() and beginClose() wait for
  // them as for uses_.
  std::atomic<int> fastUses_{0};
  // Shrinks and splits of this communicator in progress: its state is then theirs to poll
  // (NCCL's poll of it ends the thread making the child, which two threads must not do at
  // once).
  int shrinking_ = 0;
  // asyncError()'s poll of its state under way: made only with no use in progress, and no
  // use starts until it is done (usable_ is cleared, acquire() waits), since NCCL's poll
  // completes and frees a call's group job without a lock.
  int statePolls_ = 0;
  // abort()'s last step: Aborted or AbortLeftRunning.
  void noteAbort(End progress);
  std::vector<std::function<void()>> whenSettled_;
  std::function<void(const std::string&)> breakRequest_;  // empty until a group watches it
  std::thread connector_;
};

}  // namespace streamnccl
