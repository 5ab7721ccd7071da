#include "cuda/NcclConnection.hpp"

#include "core/Backoff.hpp"
#include "core/Errors.hpp"
#include "core/GroupThreads.hpp"
#include "core/StateMoves.hpp"
#include "cuda/NcclErrors.hpp"

#include <c10/util/Logging.h>

#include <cstring>
#include <set>

namespace streamnccl {
namespace {

constexpr auto kAbortGrace = std::chrono::seconds(10);
// NCCL's maximum number of CTAs (MAXCHANNELS in NCCL 2.28; an older NCCL clamps it to its own).
constexpr int kNcclMaxCtas = 64;
// While a shrink or split is in progress, how often (in polls, a few ms apart once settled) the
// Store is asked whether another member gave up.
constexpr int kPollsPerStoreCheck = 8;

// How NCCL's state and the Store are polled: fast at first (most waits are short), then settled
// at a few checks per 10 ms.
Backoff pollingBackoff() {
  return Backoff(std::chrono::microseconds(20), std::chrono::microseconds(2000));
}

// NCCL keeps the pointer it is given as a communicator's name (ncclConfig_t::commName), and a
// communicator may outlive its connection (left for CUDA graphs, or aborted on a thread of its
// own): so names are kept for the process's life. A process has few.
const char* keptForever(const std::string& name) {
  // Never destroyed, not even at exit: a communicator aborted on a thread of its own may
  // still be named then.
  static auto* const mutex = new std::mutex;
  static auto* const names = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(*mutex);
  return names->insert(name).first->c_str();
}

}  // namespace

std::shared_ptr<NcclConnection> NcclConnection::open(Settings settings) {
  std::shared_ptr<NcclConnection> connection(new NcclConnection(std::move(settings), {}));
  // The thread's reference keeps the connection alive while it connects, even if its owner
  // goes meanwhile (it then aborts the connecting). It is a group thread: ops that waited for
  // the connection are issued from it, and their futures' callbacks run there.
  connection->connector_ = std::thread([self = connection] {
    markGroupThread();
    self->connect();
  });
  return connection;
}

std::shared_ptr<NcclConnection> NcclConnection::fromParent(Settings settings, ChildOf origin) {
  std::shared_ptr<NcclConnection> connection(
      new NcclConnection(std::move(settings), std::move(origin)));
  connection->connector_ = std::thread([self = connection] {
    markGroupThread();
    self->connect();
  });
  return connection;
}

const char* NcclConnection::makingCall() const {
  if (!childOf_) {
    return "ncclCommInitRank";
  }
  return childOf_->how == ChildOf::How::Shrink ? "ncclCommShrink" : "ncclCommSplit";
}

void NcclConnection::moveTo(State to) {
  moveState(state_, to, kStateMoves, "a communicator's connecting");
  noteUsable();
}

void NcclConnection::moveTo(End to) {
  moveState(end_, to, kEndMoves, "a communicator's end");
  noteUsable();
}

bool NcclConnection::live() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Connected || end_ != End::Open || comm_ == nullptr) {
      return false;
    }
  }
  // Broken but not yet aborted by the watchdog: it soon will be, under the shrink.
  return asyncError().empty();
}

bool NcclConnection::waitAbortReturned() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, kAbortGrace,
                    [&] { return end_ == End::Aborted || end_ == End::AbortLeftRunning; });
  return end_ == End::Aborted;
}

bool NcclConnection::abortedNow() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborting();
}

NcclConnection::~NcclConnection() {
  if (connector_.joinable()) {
    if (connector_.get_id() == std::this_thread::get_id()) {
      connector_.detach();  // the connecting thread held the last reference: it ends now
    } else {
      connector_.join();
    }
  }
  if (comm_ == nullptr || aborting()) {
    return;
  }
  // Its group closes it (ProcessGroup::shutdown): this is a communicator no group closed.
  try {
    beginClose();
    if (std::string why = endClose(std::chrono::steady_clock::now() + settings_.timeout);
        !why.empty()) {
      LOG(WARNING) << who() << " " << why;
    }
  } catch (const std::exception& e) {  // a destructor: a CUDA error must not end the process
    LOG(WARNING) << who() << " closing the communicator failed: " << e.what();
  }
}

void NcclConnection::raise(const std::string& reason) const {
  throwDistBackendError(who() + " " + reason);
}

ncclUniqueId NcclConnection::exchangeId(std::chrono::steady_clock::time_point deadline) {
  ncclUniqueId id;
  auto& store = *settings_.store;
  if (settings_.makesId) {
    STREAMNCCL_NCCL_CHECK(nccl(), "ncclGetUniqueId", getUniqueId(&id), who(), nullptr);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(settings_.idKey, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    return id;
  }
  // Polled rather than a blocking get, so that abort() and the deadline can end the wait.
  Backoff backoff = pollingBackoff();
  while (!store.check({settings_.idKey})) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborting()) {
        raise("connecting was aborted");
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      raise("connecting timed out after " + std::to_string(settings_.timeout.count()) +
            " ms: the member of lowest rank never published the NCCL unique id");
    }
    backoff.pause();
  }
  const std::vector<uint8_t> bytes = store.get(settings_.idKey);
  TORCH_INTERNAL_ASSERT(bytes.size() == sizeof(id), "streamnccl: malformed NCCL unique id");
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

void NcclConnection::connect() {
  const char* call = makingCall();
  try {
    const auto deadline = std::chrono::steady_clock::now() + settings_.timeout;
    ncclComm_t comm = nullptr;
    ncclResult_t result = childOf_ ? makeFromParent(&comm, deadline) : initRank(&comm, deadline);
    if (result != ncclSuccess && result != ncclInProgress) {
      if (comm != nullptr) {
        std::lock_guard<std::mutex> lock(mutex_);
        comm_ = comm;  // aborted at destruction: it never connected
      }
      throwNcclError(nccl(), result, call, who(), nullptr, __FILE__, __LINE__);
    }
    if (childOf_ && childOf_->color == NCCL_SPLIT_NOCOLOR) {
      TORCH_INTERNAL_ASSERT(comm == nullptr, who(), " ncclCommSplit without a color made one");
      settle(State::Connected, nullptr);  // this member's part is done; there is nothing to use
      return;
    }
    TORCH_INTERNAL_ASSERT(comm != nullptr, who(), " ", call, " made no communicator");
    bool abortedMeanwhile = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      comm_ = comm;
      abortedMeanwhile = aborting();
      if (!abortedMeanwhile) {
        ++uses_;  // this thread's polling below is a use that abort() waits for
      }
    }
    if (abortedMeanwhile) {  // abort() ran before there was a communicator to abort
      auto onDevice = settings_.cuda->useDevice(settings_.device);
      nccl().commAbort(comm);
      raise("connecting was aborted");
    }
    try {
      result = pollUntilSettled(comm, call, deadline);
      if (result != ncclSuccess) {  // while still held: ncclGetLastError reads the comm
        throwNcclError(nccl(), result, call, who(), comm, __FILE__, __LINE__);
      }
    } catch (...) {
      endUse();
      throw;
    }
    endUse();
    settle(State::Connected, nullptr);
  } catch (...) {
    if (childOf_) {
      tellMembersChildFailed(std::current_exception());
    }
    settle(State::Failed, std::current_exception());
  }
}

ncclResult_t NcclConnection::initRank(ncclComm_t* comm,
                                      std::chrono::steady_clock::time_point deadline) {
  const ncclUniqueId id = exchangeId(deadline);
  auto onDevice = settings_.cuda->useDevice(settings_.device);  // the communicator's device
  ncclConfig_t config = ncclConfig();
  return nccl().commInitRankConfig(comm, settings_.size, id, settings_.rank, &config);
}

ncclConfig_t NcclConnection::ncclConfig() const {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const Options::NcclConfig& asked = settings_.config;
  if (asked.cgaClusterSize) {
    config.cgaClusterSize = *asked.cgaClusterSize;
  }
  if (asked.minCtas) {
    config.minCTAs = *asked.minCtas;
    // NCCL compares the two before it fills in its defaults, and an unset maximum is the
    // lowest int: a minimum alone would be refused. So it comes with NCCL's own maximum.
    config.maxCTAs = kNcclMaxCtas;
  }
  if (asked.maxCtas) {
    config.maxCTAs = *asked.maxCtas;
  }
  if (asked.netName) {
    config.netName = asked.netName->c_str();
  }
  if (asked.splitShare) {
    config.splitShare = *asked.splitShare ? 1 : 0;
  }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (!settings_.name.empty()) {
    config.commName = keptForever(settings_.name);
  }
  // A shrink shares resources, its abort flag among them, as its parent's config says: none,
  // since the old group aborts the parent when it ends broken, which must not stop the new
  // one. (NCCL_COMM_SHRINK_SHARE_RESOURCES would override this; Options refuses it.)
  config.shrinkShare = 0;
#endif
  return config;
}

ncclResult_t NcclConnection::pollUntilSettled(ncclComm_t comm, const char* call,
                                              std::chrono::steady_clock::time_point deadline,
                                              bool ofParentMakingChild) const {
  Backoff backoff = pollingBackoff();
  int polls = 0;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = nccl().commGetAsyncError(comm, &state);
    if (result != ncclSuccess) {
      if (ofParentMakingChild) {  // NCCL's thread may still be making the new one: end it
        raise(std::string("ncclCommGetAsyncError failed while ") + call +
              " was in progress: " + nccl().getErrorString(result));
      }
      return result;
    }
    if (state != ncclInProgress) {
      return state;
    }
    // The parent being aborted ends the making of its child too: it waits for this use of it.
    if (abortedNow() || (ofParentMakingChild && childOf_->parent->abortedNow())) {
      raise(std::string("aborted while ") + call + " was in progress");
    }
    if (ofParentMakingChild && ++polls % kPollsPerStoreCheck == 0) {
      if (std::string why = childGivenUp(); !why.empty()) {
        raise(std::string(call) + " ended: another member gave up on it: " + why);
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      raise(std::string(call) + " did not finish within " +
            std::to_string(settings_.timeout.count()) + " ms" +
            (std::strcmp(call, "ncclCommInitRank") == 0 ||
                     std::strcmp(call, "ncclCommShrink") == 0 ||
                     std::strcmp(call, "ncclCommSplit") == 0
                 ? ": a member of the communicator never joined it"
                 : ""));
    }
    backoff.pause();
  }
}

void NcclConnection::settle(State state, std::exception_ptr failure) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Connecting) {
      // Settled already: what failed after that (the settling itself, out of memory) changes
      // nothing of how connecting ended.
      return;
    }
    moveTo(state);
    failure_ = std::move(failure);
    callbacks.swap(whenSettled_);  // later ones run at once (whenSettled)
  }
  changed_.notify_all();  // uses may go on: the callbacks' own work needs them
  for (auto& callback : callbacks) {
    try {
      callback();
    } catch (...) {  // one failing must not strand the others
      LOG(ERROR) << who() << " work issued once connecting ended failed: "
                 << describeException(std::current_exception());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    settled_ = true;
  }
  changed_.notify_all();
}

void NcclConnection::whenSettled(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::Connecting) {
      whenSettled_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void NcclConnection::waitConnected() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return settled_ || aborting(); });
  if (aborting()) {
    raise("connecting was aborted");
  }
  if (state_ == State::Failed) {
    std::rethrow_exception(failure_);
  }
}

NcclConnection::Use NcclConnection::use(const char* call) {
  // Every NCCL call of every op comes here: the common case, connected and neither aborted nor
  // closed, takes no lock. A use counts itself before it looks at `usable_`, and abort() and
  // beginClose() clear it before they count the uses (all sequentially consistent): either
  // this sees it cleared and backs off, or they see this use and wait for it to end.
  if (usable_.load()) {
    fastUses_.fetch_add(1);
    if (usable_.load()) {
      return Use(*this, comm_, /*counted=*/true);  // comm_ is set before usable_, kept after
    }
    endCountedUse();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  acquire(call, lock);
  return Use(*this, comm_, /*counted=*/false);
}

void NcclConnection::noteUsable() {
  usable_.store(state_ == State::Connected && end_ == End::Open && statePolls_ == 0);
}

bool NcclConnection::noUseInProgress() const { return uses_ == 0 && fastUses_.load() == 0; }

void NcclConnection::endCountedUse() {
  fastUses_.fetch_sub(1);
  if (!usable_.load()) {
    // An abort() or beginClose() may be waiting for the uses to end: woken under its lock, so
    // that it is either asleep already or has yet to count the uses, and then sees this end.
    { std::lock_guard<std::mutex> lock(mutex_); }
    changed_.notify_all();
  }
}

void NcclConnection::acquire(const char* call) {
  std::unique_lock<std::mutex> lock(mutex_);
  acquire(call, lock);
}

void NcclConnection::acquire(const char* call, std::unique_lock<std::mutex>& lock) {
  // A poll of its state under way (asyncError()) is never long: a use waits for it.
  changed_.wait(lock,
                [&] { return (state_ != State::Connecting && statePolls_ == 0) || aborting(); });
  if (aborting()) {
    raise(std::string(call) + ": the communicator was aborted");
  }
  if (end_ != End::Open) {
    raise(std::string(call) + ": the communicator was destroyed with its group");
  }
  if (state_ == State::Failed) {
    std::rethrow_exception(failure_);
  }
  ++uses_;
}

void NcclConnection::endUse() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --uses_;
  }
  changed_.notify_all();
}

NcclConnection::Use::~Use() {
  if (counted_) {
    connection_.endCountedUse();
  } else {
    connection_.endUse();
  }
}

void NcclConnection::Use::check(const char* call, ncclResult_t result) const {
  connection_.checkHeld(call, result);
}

void NcclConnection::checkHeld(const char* call, ncclResult_t result) {
  if (result == ncclSuccess) {
    return;
  }
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comm = comm_;  // held: abort() waits before freeing it
  }
  if (result == ncclInProgress) {
    // A non-blocking communicator is still enqueueing the call: until it is done, nothing
    // else may be issued, nor an event recorded after it.
    result = pollUntilSettled(comm, call, std::chrono::steady_clock::now() + settings_.timeout);
  }
  if (result != ncclSuccess) {
    throwNcclError(nccl(), result, call, who(), comm, __FILE__, __LINE__);
  }
}

void NcclConnection::abort() {
  ncclComm_t comm = nullptr;
  bool captured = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (aborting()) {
      return;
    }
    moveTo(End::Aborting);
    changed_.notify_all();
    // Uses poll and see the abort at once; none blocks inside NCCL, whose calls on a
    // non-blocking communicator return at once.
    if (!changed_.wait_for(lock, kAbortGrace, [&] { return noUseInProgress(); })) {
      LOG(WARNING) << who() << " a call on the communicator did not return within "
                   << kAbortGrace.count() << " s of abort(); aborting it anyway";
    }
    comm = std::exchange(comm_, nullptr);  // this abort frees it: nothing else may now
    captured = captured_;
  }
  changed_.notify_all();
  if (comm == nullptr) {
    noteAbort(End::Aborted);
    return;
  }
  auto abortComm = [nccl = settings_.nccl, cuda = settings_.cuda, device = settings_.device,
                    who = who(), comm] {
    try {
      auto onDevice = cuda->useDevice(device);
      const ncclResult_t result = nccl->commAbort(comm);
      if (result != ncclSuccess) {
        LOG(WARNING) << who << " ncclCommAbort failed: " << nccl->getErrorString(result);
      }
    } catch (const std::exception& e) {  // on a thread of its own too: nothing may escape
      LOG(WARNING) << who << " ncclCommAbort failed: " << e.what();
    }
  };
  if (captured) {
    // ncclCommAbort first tells the communicator's kernels to quit, which is what a hung op
    // needs, and then waits until every CUDA graph with work on it is destroyed, which may be
    // never. So it runs on a thread of its own: the kernels stop now, and only that thread
    // waits for the graphs.
    LOG(WARNING) << who() << " aborted on a thread of its own: work on it was captured into a "
                 << "CUDA graph, and NCCL frees it only once every such graph is destroyed";
    std::thread(std::move(abortComm)).detach();
    noteAbort(End::AbortLeftRunning);
    return;
  }
  abortComm();
  noteAbort(End::Aborted);
}

void NcclConnection::noteAbort(End progress) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    moveTo(progress);
  }
  changed_.notify_all();
}

void NcclConnection::beginClose() {
  ncclComm_t comm = nullptr;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (end_ != End::Open) {
      return;
    }
    if (state_ != State::Connected) {
      // Still connecting (its connecting thread holds a use until then) or never connected:
      // nothing to flush, so no call to wait for.
      moveTo(End::CloseByAbort);
      return;
    }
    if (captured_) {
      // NCCL finalizes or destroys a communicator only once every CUDA graph that captured
      // work on it is destroyed, and the group cannot know when that is: waiting could be
      // forever (at exit, always). So it is left to the process's end.
      moveTo(End::LeftForGraphs);
      lock.unlock();
      LOG(WARNING) << who()
                   << " left as it is, not finalized: work on it was captured into a CUDA graph, "
                      "and NCCL would wait for every such graph to be destroyed";
      return;
    }
    moveTo(End::Closing);  // no Use from now on
    // A call in progress on another thread (NCCL communicators are not thread-safe) ends
    // before the communicator is finalized under it.
    if (!changed_.wait_for(lock, kAbortGrace, [&] { return noUseInProgress(); })) {
      LOG(WARNING) << who() << " a call on the communicator did not return within "
                   << kAbortGrace.count() << " s of its group's end; finalizing it anyway";
    }
    if (end_ != End::Closing) {  // aborted meanwhile: the abort has freed it
      return;
    }
    comm = comm_;
    ++uses_;  // the finalize call is a use that abort() waits for
    moveTo(End::Finalizing);
    finalized_ = ncclInternalError;  // until ncclCommFinalize has been called
  }
  ncclResult_t result = ncclInternalError;
  try {
    auto onDevice = settings_.cuda->useDevice(settings_.device);
    result = nccl().commFinalize(comm);
  } catch (const std::exception& e) {
    LOG(WARNING) << who() << " ncclCommFinalize could not be called: " << e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finalized_ = result;
  }
  endUse();  // between the two steps it is not in use: abort() may end it at once
}

std::string NcclConnection::endClose(std::chrono::steady_clock::time_point deadline) {
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclSuccess;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (end_ == End::CloseByAbort) {
      // Still connecting (nobody will use it now), or never connected: nothing to flush.
      lock.unlock();
      abort();
      return {};
    }
    if (end_ != End::Finalizing) {  // left for graphs, or aborted: the abort has freed it
      return {};
    }
    moveTo(End::Destroying);
    comm = comm_;
    result = finalized_;
    ++uses_;  // polling and destroying are a use that abort() waits for
  }
  std::string why;
  try {
    auto onDevice = settings_.cuda->useDevice(settings_.device);
    if (result == ncclSuccess || result == ncclInProgress) {
      // Finalizing flushes the communicator's work on every member: polled, not blocked on,
      // so that the deadline and abort() can end it.
      result = pollUntilSettled(comm, "ncclCommFinalize", deadline);
    }
    if (result != ncclSuccess) {
      why = std::string("ncclCommFinalize failed: ") + nccl().getErrorString(result);
    } else {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        comm_ = nullptr;                // this destroy frees it: abort() has nothing left to abort
        if (end_ == End::Destroying) {  // else an abort() waits for this use to end
          moveTo(End::Destroyed);
        }
      }
      result = nccl().commDestroy(comm);
      if (result != ncclSuccess) {
        LOG(WARNING) << who() << " ncclCommDestroy failed: " << nccl().getErrorString(result);
      }
    }
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();  // for the log: the reason, not where it was raised
  } catch (const std::exception& e) {
    why = e.what();
  }
  endUse();
  if (why.empty()) {
    return {};
  }
  abort();
  return why + ": aborted the communicator instead";
}

void NcclConnection::noteCaptured() {
  std::lock_guard<std::mutex> lock(mutex_);
  captured_ = true;
}

void NcclConnection::abandon() {
  bool connecting = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    connecting = state_ == State::Connecting;
  }
  if (connecting) {
    abort();
  }
}

std::string NcclConnection::asyncError() {
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // While it is shrunk, its state is the shrink's to poll: the shrink reports its errors.
    if (state_ != State::Connected || end_ != End::Open || shrinking_ > 0) {
      return {};
    }
    // A call in progress is polled by its own thread (Use::check), and NCCL's poll completes
    // and frees the call's group job without a lock: this poll waits for a moment with no
    // use. New uses wait for it (usable_ is cleared while it runs); one already counted, as
    // seen after that, means this period's poll is skipped (the caller's own poll, or the
    // next period's, reports the error).
    ++statePolls_;
    noteUsable();
    if (!noUseInProgress()) {
      --statePolls_;
      noteUsable();
      changed_.notify_all();
      return {};
    }
    ++uses_;
    comm = comm_;
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = nccl().commGetAsyncError(comm, &state);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --statePolls_;
    noteUsable();
  }
  changed_.notify_all();
  std::string error;
  if (result != ncclSuccess) {
    error = who() + " ncclCommGetAsyncError failed: " + nccl().getErrorString(result);
  } else if (state != ncclSuccess && state != ncclInProgress) {
    const char* detail = nccl().getLastError(comm);
    error = who() + " asynchronous NCCL error: " + nccl().getErrorString(state) +
            (detail && *detail ? std::string(" (") + detail + ")" : "");
  }
  endUse();
  return error;
}

}  // namespace streamnccl
