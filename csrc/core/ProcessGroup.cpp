#include "core/ProcessGroup.hpp"

#include "core/BreakWatcher.hpp"
#include "core/Errors.hpp"
#include "core/GroupTeardown.hpp"
#include "core/GroupThreads.hpp"
#include "core/StateMoves.hpp"
#include "core/hooks/Hooks.hpp"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <c10/util/ScopeExit.h>

#include <algorithm>
#include <numeric>
#include <utility>

namespace streamnccl {
namespace {

std::atomic<int64_t> groupsMade{0};

// `rank`, checked against `size` before any of the group's threads starts.
int validRank(int rank, int size) {
  TORCH_CHECK_VALUE(size > 0 && rank >= 0 && rank < size, "streamnccl: rank ", rank,
                    " is not in [0, ", size, ")");
  return rank;
}

// 0 to size - 1: a group's members' global ranks until setGlobalRanks() says otherwise.
std::vector<int> makeGlobalRanks(int size) {
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

// Where this group shares its breaks with its other ranks (Options::propagateErrors), or null.
std::shared_ptr<BreakBoard> breakBoardFor(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int size, const Options& options) {
  if (!store || size < 2 || !options.usePropagateErrors()) {
    return nullptr;
  }
  return BreakBoard::open(
      store, rank, size,
      "[streamnccl rank " + std::to_string(rank) + "/" + std::to_string(size) + "]");
}

}  // namespace

ProcessGroup::ProcessGroup(Key /*key*/, int rank, int size,
                           c10::intrusive_ptr<streamnccl::Options> options, PathFactories factories,
                           c10::intrusive_ptr<c10d::Store> store)
    : c10d::Backend(validRank(rank, size), size),
      options_(std::move(options)),
      factories_(std::move(factories)),
      store_(std::move(store)),
      health_(std::make_shared<GroupHealth>(options_->flightRecorderCapacity(), options_->dumpDir,
                                            rank)),
      stats_(std::make_shared<GroupStats>()),
      watchdog_(Watchdog::start(
          health_, stats_, [this] { return groupInfo(); },
          breakBoardFor(store_, rank, size, *options_))),
      uid_(groupsMade++),
      globalRanks_(makeGlobalRanks(size)),
      launcher_(*this, *options_, watchdog_, launchHooks()) {}

LaunchHooks ProcessGroup::launchHooks() {
  const hooks::GroupView view{*this, globalRanks_};
  LaunchHooks made;
  made.push_back(hooks::profilerRange(view));  // first: its range holds the others' work
  made.push_back(hooks::recorderEntries(view, uid_));
  if (options_->useDebugChecks()) {
    made.push_back(hooks::sameOpCheck(view, store_, watchdog_));
  }
  for (const auto& maker : hooks::hookMakers()) {  // those added from outside (_testing's)
    if (auto hook = maker(view)) {
      made.push_back(std::move(hook));
    }
  }
  made.push_back(hooks::statsCount(stats_));
  if (options_->useInflightWriteChecks()) {
    made.push_back(hooks::inflightWritesWatch(std::make_shared<InflightWrites>()));
  }
  made.push_back(hooks::issueTimes(watchdog_));
  return made;
}

void ProcessGroup::shutdownAll() {
  // Each in the order the groups were made, which every rank shares: closing a group's
  // communicators meets the other ranks' closing of theirs. Held here meanwhile: a group let
  // go of in an op's callback during its flush is torn down once this lets go of it too.
  for (const auto& group : groupRegistry::alive()) {
    group->shutdown();
  }
  // Then the groups whose last reference went elsewhere meanwhile (their teardowns run beside
  // this walk, as they would have without an exit), and those let go of on their own threads,
  // whose teardown runs apart.
  groupRegistry::waitForTheDying();
  waitForTeardownsApart();
  breakWatcher::stop();
}

void ProcessGroup::retireCompletedOfAll() {
  for (const auto& watchdog : groupRegistry::watchdogs()) {
    watchdog->releaseCompleted();
  }
}

c10d::ErrorType ProcessGroup::getError() {
  if (health_->broken()) {
    watchdog_->awaitOpsFailed();
  }
  return health_->errorType();
}

void ProcessGroup::shutdown() {
  {
    // Later calls raise from here on; the first caller to say so closes the group.
    std::unique_lock<std::mutex> lock(closedMutex_);
    if (life_.load() != Life::Open) {
      // Another call is closing the group. On one of the group's threads, waiting for it could
      // be waiting for ourselves (it waits for the op whose callback this is): return at once,
      // as a teardown run apart does.
      if (!onGroupThread()) {
        closedChanged_.wait(lock, [&] { return life_.load() == Life::Closed; });
      }
      return;
    }
    moveLife(Life::Closing);
  }
  // Said even if close() throws (only out of memory): nobody waits for ever; nobody retries.
  auto returned = c10::make_scope_exit([&] {
    {
      std::lock_guard<std::mutex> lock(closedMutex_);
      moveLife(Life::Closed);
    }
    closedChanged_.notify_all();
  });
  close();
}

void ProcessGroup::moveLife(Life to) {
  Life life = life_.load();
  moveState(life, to, kLifeMoves, "a group's teardown");
  life_.store(life, std::memory_order_release);
}

void ProcessGroup::letGo() {
  if (std::exchange(letGo_, true)) {
    return;  // release_resources() ran, and this is the destructor
  }
  // On a group thread the teardown goes apart: counted as such before the group leaves the
  // registry, so that the exit, once it no longer sees the group there, waits for it.
  apartReserved_ = onGroupThread();
  if (apartReserved_) {
    reserveTeardownApart();
  }
  shutdown();
  if (apartReserved_) {
    unreserveTeardownApart();  // not used: the group was being closed already
  }
  groupRegistry::remove(this);
}

void ProcessGroup::close() {
  const bool onItsThread = onGroupThread();
  // (The coalescing state is the calling thread's program order: not a group thread's to touch.)
  if (coalescing_ && !onItsThread) {
    const std::string why = who() + " shut down with a coalescing group still open: its " +
                            std::to_string(coalescing_->steps.size()) +
                            " op(s) were never launched";
    LOG(WARNING) << why;
    if (coalescing_->future) {  // what the group's ops handed out must not wait for ever
      coalescing_->future->setErrorIfNeeded(makeDistBackendError(why));
    }
    coalescing_.reset();
  }
  // From here on the watchdog names the group without asking it: the group may be gone
  // before the watchdog stops (below, when the teardown runs apart).
  const OpInfo group = groupInfo();
  watchdog_->describeGroupAs(group);
  GroupTeardown teardown{group, options_->timeout, watchdog_, health_, shrunk_.load(), {}};
  if (onItsThread) {
    LOG(INFO) << who() << " shut down on a thread of a group (an op's future callback let go "
              << "of it, or shut it down): the teardown goes on on a thread of its own";
    teardown.paths = {anySourceLanes_.release(), lanes_.release(), paths_.release()};
    runApart(std::move(teardown), /*reserved=*/std::exchange(apartReserved_, false));
    return;
  }
  teardown.run();
  // Each device finishes what its streams hold (the host's workers have nothing left).
  anySourceLanes_.clear();
  lanes_.clear();
  paths_.clear();
}

OpInfo ProcessGroup::groupInfo() const {
  OpInfo info;
  info.rank = getRank();
  info.size = getSize();
  info.group = getGroupUid();
  return info;
}

void ProcessGroup::abort() {
  // Posted for the other ranks, without waiting for their answers: the caller knows the cause.
  watchdog_->breakGroup(groupInfo(), makeDistBackendError(who() + " aborted by the caller"), {},
                        Watchdog::BreakAs{GroupHealth::Cause::Fault, Watchdog::Kernels::Abort,
                                          /*shared=*/true, /*rollCall=*/false});
}

std::string ProcessGroup::who() const { return groupInfo().who(); }

PathFactory& ProcessGroup::factoryFor(const c10::Device& device, const char* op) const {
  auto factory = factories_.find(device.type());
  STREAMNCCL_CHECK_ARG(factory != factories_.end(), op, "tensors on ", device,
                       " are not supported by this build of streamnccl (paths built: ",
                       factories_.count(c10::kCUDA) ? "host and NCCL" : "host only",
                       "); expected cpu", factories_.count(c10::kCUDA) ? " or cuda" : "",
                       " tensors");
  return *factory->second;
}

template <typename Open>
auto ProcessGroup::openOrRefuse(const char* op, const c10::Device& device, Open open)
    -> decltype(open()) {
  try {
    return open();
  } catch (const c10::DistError& e) {
    auto fault = makeDistBackendError(who() + " " + op + ": connecting " + device.str() +
                                      " failed: " + e.what_without_backtrace());
    watchdog_->breakGroup(groupInfo(), fault);
    std::rethrow_exception(fault);
  } catch (const c10::Error& e) {
    STREAMNCCL_CHECK_ARG(false, op, "cannot use ", device, ": ", e.what_without_backtrace());
  }
}

void ProcessGroup::refuseIfBroken(const char* op) const {
  if (health_->broken()) {
    health_->raiseIfBroken(groupInfo(), op);  // rather than open a path the group cannot use
  }
  if (closed()) {
    throwDistBackendError(who() + " " + op +
                          ": the group was shut down (destroy_process_group); create a new one");
  }
}

Path& ProcessGroup::pathFor(const c10::Device& requested, const char* op) {
  refuseIfBroken(op);
  // "cpu:0" (a bound device) and "cpu" (a tensor's) are the same host.
  const c10::Device device = requested.is_cpu() ? c10::Device(c10::kCPU) : requested;
  return paths_.get(device, [&] {
    PathFactory& factory = factoryFor(device, op);
    auto path = openOrRefuse(op, device, [&] {
      auto opened = factory.open(device);
      watchdog_->watch(opened->communicator);
      // Every rank opens it at the same op, so waiting here waits only for the others to
      // arrive (or the timeout, or abort()).
      opened->communicator->waitReady();
      return opened;
    });
    if (!device.is_cpu()) {
      std::lock_guard<std::mutex> lock(lastDeviceMutex_);
      lastAcceleratorDevice_ = device;
    }
    return path;
  });
}

void ProcessGroup::adoptPath(const c10::Device& device, std::unique_ptr<Path> path,
                             const char* op) {
  paths_.get(device, [&] {
    openOrRefuse(op, device, [&] {
      watchdog_->watch(path->communicator);
      path->communicator->waitReady();  // the others all make it now: this waits for them
    });
    return std::move(path);
  });
}

void ProcessGroup::setGlobalRanks(std::vector<int> globalRanks) {
  TORCH_CHECK_VALUE(static_cast<int>(globalRanks.size()) == getSize(),
                    "streamnccl: ", globalRanks.size(), " global ranks given for a group of ",
                    getSize());
  health_->setGlobalRank(globalRanks[getRank()]);
  globalRanks_ = std::move(globalRanks);
}

void ProcessGroup::eagerConnectSingleDevice(at::Device device) {
  pathFor(device, "eager_connect_single_device");
}

Path& ProcessGroup::laneFor(const c10::Device& device, int peer, Direction direction,
                            const char* op) {
  STREAMNCCL_CHECK_ARG(peer != getRank(), op, "`", direction == Direction::Send ? "dst" : "src",
                       "` is this rank (", peer, "); a rank cannot send to or receive from itself");
  refuseIfBroken(op);
  // Lanes are not waited for: their first ops wait on their own streams until the peer has
  // opened its side too (a rank's first send to one peer must not wait for that peer, which
  // may be sending to a third one first).
  PeerLanes& lanes = lanes_.get({device, peer}, [&] {
    PathFactory& factory = factoryFor(device, op);
    return openOrRefuse(op, device, [&] {
      auto opened = std::make_unique<PeerLanes>(factory.openPeer(device, peer));
      watchdog_->watch(opened->sends->communicator);
      watchdog_->watch(opened->receives->communicator);
      return opened;
    });
  });
  if (options_->hasSingleHardwareQueue()) {
    // One hardware queue runs work in issue order across every stream, so held-back first
    // ops would reach it after later ones (a collective, say) and wait in a circle with a peer
    // that issued them in program order. Here the first contact waits until both lanes have
    // connected (up to the timeout), as ProcessGroupNCCL's blocking init does.
    lanes.sends->communicator->waitReady();
    lanes.receives->communicator->waitReady();
  }
  return direction == Direction::Send ? *lanes.sends : *lanes.receives;
}

Path& ProcessGroup::anySourceLaneFor(const c10::Device& device, const char* op) {
  refuseIfBroken(op);
  return anySourceLanes_.get(device, [&] {
    PathFactory& factory = factoryFor(device, op);
    return openOrRefuse(op, device, [&] {
      auto opened = factory.openAnySource(device);
      watchdog_->watch(opened->communicator);
      return opened;
    });
  });
}

c10::intrusive_ptr<Work> ProcessGroup::launch(Launch launch, Path& path, Steps steps,
                                              c10::intrusive_ptr<c10::ivalue::Future> future) {
  refuseIfBroken(launch.op);
  return launcher_.launch(std::move(launch), path, std::move(steps), std::move(future));
}

}  // namespace streamnccl
