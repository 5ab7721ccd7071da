#include "core/ProcessGroup.hpp"

#include "core/BreakWatcher.hpp"
#include "core/Errors.hpp"
#include "core/GroupTeardown.hpp"
#include "core/GroupThreads.hpp"
#include "core/StoreKeys.hpp"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <c10/util/ScopeExit.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <utility>

namespace streamnccl {
namespace {

// Fails the split meeting in `store` (SplitOf::store; nothing without one) for `reason`: the
// verdict every rank taking part reads (CudaPath.cpp), unless one was given already.
void failSplit(const c10::intrusive_ptr<c10d::Store>& store, const std::string& reason) {
  if (store) {
    store->compareSet(keys::splitVerdict(), {}, std::vector<uint8_t>(reason.begin(), reason.end()));
  }
}

std::atomic<int64_t> groupsMade{0};

// `rank`, checked against `size` before any of the group's threads starts.
int validRank(int rank, int size) {
  TORCH_CHECK_VALUE(size > 0 && rank >= 0 && rank < size, "streamnccl: rank ", rank,
                    " is not in [0, ", size, ")");
  return rank;
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
      inflightWrites_(options_->useInflightWriteChecks() ? std::make_shared<InflightWrites>()
                                                         : nullptr),
      uid_(groupsMade++) {
  timed_.store(options_->useTiming());
  globalRanks_.resize(size);
  std::iota(globalRanks_.begin(), globalRanks_.end(), 0);
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

void ProcessGroup::shutdown() {
  // Later calls raise from here on; the first caller to say so closes the group.
  if (shutDown_.exchange(true, std::memory_order_acq_rel)) {
    // Another call is closing the group. On one of the group's threads, waiting for it could
    // be waiting for ourselves (it waits for the op whose callback this is): return at once,
    // as a teardown run apart does.
    if (!onGroupThread()) {
      std::unique_lock<std::mutex> lock(closedMutex_);
      closedChanged_.wait(lock, [&] { return closeReturned_; });
    }
    return;
  }
  // Said even if close() throws (only out of memory): nobody waits for ever; nobody retries.
  auto returned = c10::make_scope_exit([&] {
    {
      std::lock_guard<std::mutex> lock(closedMutex_);
      closeReturned_ = true;
    }
    closedChanged_.notify_all();
  });
  close();
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
  if (shutDown_.load(std::memory_order_acquire)) {
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

c10::intrusive_ptr<c10d::Backend> ProcessGroup::splitAs(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts, const std::string& agreement) {
  std::lock_guard<std::mutex> lock(splitMutex_);
  if (lastSplit_ && lastSplit_->store == store && lastSplit_->ranks == ranks) {
    return lastSplit_->group;
  }
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  // Numbered first, so that every rank counts this split, whatever happens to it here.
  PathFactory::SplitOf of = splitOf(agreement, options_->timeout);
  // The subgroup's own settings when they are ours (pg_options of split_group), else ours.
  const auto* requested = dynamic_cast<const streamnccl::Options*>(opts.get());
  c10::intrusive_ptr<streamnccl::Options> options;
  try {
    options = streamnccl::Options::fromEnv(requested ? *requested : *options_);
  } catch (const c10::Error& refused) {
    // The other ranks wait for this one: end their wait.
    failSplit(of.store,
              who() + " split_group's options were refused: " + refused.what_without_backtrace());
    throw;
  }
  if (opts) {
    options->timeout = opts->timeout;
  }
  of.timeout = options->timeout;
  if (me == ranks.end()) {
    for (const auto& [type, factory] : factories_) {
      factory->splitWithout(ofType(of, type));
    }
    lastSplit_ = LastSplit{store, ranks, nullptr};
    return nullptr;
  }
  // torch makes a subgroup's store from its own, which a restarted torchelastic worker shares
  // with the attempt before: as python/streamnccl does for every group it creates, each
  // attempt keeps to keys of its own (a dead worker's Gloo address or NCCL unique id).
  const c10::intrusive_ptr<c10d::Store> ours = keys::storeOfThisAttempt(store);
  PathFactories factories;
  std::vector<std::pair<c10::Device, std::unique_ptr<Path>>> paths;
  for (const auto& [type, factory] : factories_) {
    PathFactory::Subgroup subgroup = factory->splitOf(ours, ranks, options, ofType(of, type));
    factories.emplace(type, std::move(subgroup.factory));
    for (auto& entry : subgroup.paths) {
      paths.push_back(std::move(entry));
    }
  }
  // The subgroup's debug checks meet through its own store.
  auto group =
      ProcessGroup::make(static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                         options, std::move(factories), ours);
  std::vector<int> globalRanks;
  for (const int rank : ranks) {
    globalRanks.push_back(globalRanks_.at(rank));
  }
  group->setGlobalRanks(std::move(globalRanks));
  for (auto& [device, path] : paths) {
    group->adoptPath(device, std::move(path), "split");
  }
  lastSplit_ = LastSplit{store, ranks, group};
  return group;
}

void ProcessGroup::splitWithout(const c10::Device& device, const std::string& agreement) {
  std::lock_guard<std::mutex> lock(splitMutex_);
  const PathFactory::SplitOf of = splitOf(agreement, options_->timeout);
  factoryFor(device, "split").splitWithout(ofType(of, device.type()));
  lastSplit_.reset();
}

PathFactory::SplitOf ProcessGroup::splitOf(const std::string& agreement,
                                           std::chrono::milliseconds timeout) {
  PathFactory::SplitOf of;
  if (store_) {
    // split_group's: every rank of this group splits it in the same order (torch requires it,
    // as NCCL does), so the n-th split of each meets under the same prefix.
    of.store = splitStore(agreement.empty() ? std::to_string(splits_++) : agreement);
  }
  of.rank = getRank();
  of.size = getSize();
  of.opened = paths_.made();
  of.timeout = timeout;
  if (const std::string why = awaitOpsInFlight("split", of.opened, timeout); !why.empty()) {
    failSplit(of.store, why);  // the others end at once too
    throwDistBackendError(why);
  }
  return of;
}

c10::intrusive_ptr<c10d::Store> ProcessGroup::splitStore(const std::string& name) const {
  if (!store_) {
    return nullptr;
  }
  return c10::make_intrusive<c10d::PrefixStore>(keys::split(name), store_);
}

void ProcessGroup::refuseSplit(const std::string& agreement, const std::string& why) {
  failSplit(splitStore(agreement), who() + " " + why);
}

PathFactory::SplitOf ProcessGroup::ofType(const PathFactory::SplitOf& of, c10::DeviceType type) {
  PathFactory::SplitOf mine = of;
  mine.opened.clear();
  std::copy_if(of.opened.begin(), of.opened.end(), std::back_inserter(mine.opened),
               [type](const auto& entry) { return entry.first.type() == type; });
  return mine;
}

void ProcessGroup::setGlobalRanks(std::vector<int> globalRanks) {
  TORCH_CHECK_VALUE(static_cast<int>(globalRanks.size()) == getSize(),
                    "streamnccl: ", globalRanks.size(), " global ranks given for a group of ",
                    getSize());
  health_->setGlobalRank(globalRanks[getRank()]);
  globalRanks_ = std::move(globalRanks);
}

const std::shared_ptr<const RecordedGroup>& ProcessGroup::recordedGroup() {
  if (recordedGroupReady_.load(std::memory_order_acquire)) {  // every op but the first
    return recordedGroup_;
  }
  std::call_once(recordedGroupMade_, [&] {
    auto group = std::make_shared<RecordedGroup>();
    group->uid = uid_;
    group->name = getGroupUid().empty() ? std::to_string(uid_) : getGroupUid();
    group->desc = getGroupDesc();
    group->globalRanks = globalRanks_;
    recordedGroup_ = std::move(group);
    recordedGroupReady_.store(true, std::memory_order_release);
  });
  return recordedGroup_;
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

c10::intrusive_ptr<c10d::Work> ProcessGroup::submit(Launch launch, Path& path, Steps steps) {
  if (!coalescing_) {
    return this->launch(std::move(launch), path, std::move(steps));
  }
  Coalesced& group = *coalescing_;
  if (group.path == nullptr) {
    group.path = &path;
    group.future = makeFuture(*path.device);
  }
  STREAMNCCL_CHECK_ARG(group.path == &path, launch.op, "tensors on ", path.device->device(),
                       " cannot join a coalesced group on ", group.path->device->device(),
                       "; one group runs on one device");
  group.steps.push_back(std::move(steps));
  group.inputs.insert(group.inputs.end(), launch.inputs.get().begin(), launch.inputs.get().end());
  group.outputs.insert(group.outputs.end(), launch.outputs.begin(), launch.outputs.end());
  // The group's future: waiting on it waits for the whole group, once it has been ended.
  return c10d::Work::create_from_future(group.future);
}

namespace {

int64_t elementsOf(const std::vector<at::Tensor>& tensors) {
  int64_t count = 0;
  for (const auto& tensor : tensors) {
    count += tensor.numel();
  }
  return count;
}

uint64_t bytesOf(const std::vector<at::Tensor>& tensors) {
  uint64_t bytes = 0;
  for (const auto& tensor : tensors) {
    bytes += tensor.nbytes();
  }
  return bytes;
}

// "nccl:" and the op's kind, made once per kind rather than at every launch.
const std::string& profilingName(c10d::OpType opType) {
  static const auto names = [] {
    std::array<std::string, static_cast<size_t>(c10d::OpType::UNKNOWN) + 1> made;
    for (size_t type = 0; type < made.size(); ++type) {
      const auto opType = static_cast<c10d::OpType>(type);
      made[type] = std::string("nccl:") +
                   (opType == c10d::OpType::BARRIER ? "all_reduce_barrier" : opKindName(opType));
    }
    return made;
  }();
  return names.at(static_cast<size_t>(opType));
}

bool isPointToPoint(c10d::OpType opType) {
  return opType == c10d::OpType::SEND || opType == c10d::OpType::RECV ||
         opType == c10d::OpType::RECVANYSOURCE;
}

}  // namespace

c10::intrusive_ptr<Work> ProcessGroup::launch(Launch launch, Path& path, Steps steps,
                                              c10::intrusive_ptr<c10::ivalue::Future> future) {
  // RECORD_PARAM_COMMS_DATA's steps, as ProcessGroupNCCL takes them, with its range asked
  // first: when nothing observes ops (the common case) that answer is lock-free, and nothing
  // of the metadata is made. The range takes one sampling step, as the macro's does. The
  // metadata outlives the range, as the macro's: the profiler reads it at the range's ends.
  std::optional<c10::DebugInfoGuard> metadata;
  std::vector<c10::IValue> params;  // the range keeps a view of them until it ends
  at::RecordFunction range(at::RecordScope::FUNCTION);
  if (!range.isActive()) {
    return issue(std::move(launch), path, std::move(steps), std::move(future));
  }
  // The group's members as the profiler's metadata describes them: a start and a stride
  // when they are evenly spaced (-1 when not).
  const int start = globalRanks_.front();
  int stride = globalRanks_.size() > 1 ? globalRanks_[1] - globalRanks_[0] : 1;
  for (size_t i = 1; i < globalRanks_.size(); ++i) {
    if (globalRanks_[i] - globalRanks_[i - 1] != stride) {
      stride = -1;
    }
  }
  const auto seq =
      std::make_tuple(static_cast<int64_t>(seq_.load() + 1), isPointToPoint(launch.opType));
  const auto name = std::make_tuple(getGroupUid(), getGroupDesc());
  metadata.emplace(c10::DebugInfoKind::PARAM_COMMS_INFO,
                   std::make_shared<torch::ParamCommsDebugInfo>(
                       name, getRank(), launch.op, elementsOf(launch.inputs.get()),
                       elementsOf(launch.outputs), launch.shapeOf.scalar_type(),
                       launch.inputSplitSizes, launch.outputSplitSizes, start, stride, getSize()));
  if (range.needsInputs()) {
    const std::initializer_list<const c10::IValue> values = {c10::IValue(launch.inputs.get()),
                                                             seq,
                                                             name,
                                                             getRank(),
                                                             launch.op,
                                                             launch.inputSplitSizes,
                                                             launch.outputSplitSizes,
                                                             start,
                                                             stride,
                                                             getSize()};
    params.assign(values.begin(), values.end());
    range.before(at::kParamCommsCallName,
                 c10::ArrayRef<const c10::IValue>(params.data(), params.size()));
  } else {
    range.before(at::kParamCommsCallName);
  }
  if (range.needsOutputs()) {
    range.setOutputs(std::vector<c10::IValue>(1, c10::IValue(launch.outputs)));
  }
  return issue(std::move(launch), path, std::move(steps), std::move(future));
}

int64_t ProcessGroup::trace(const Launch& launch, std::chrono::milliseconds timeout,
                            RecorderClock& clock) {
  const bool p2p = isPointToPoint(launch.opType);
  ++(p2p ? p2pSeq_ : collectiveSeq_);
  ++opId_;
  FlightRecorder& recorder = FlightRecorder::instance();
  if (!recorder.enabled()) {
    return -1;
  }
  RecordedOp op;
  // As ProcessGroupNCCL names its ops, which is what the analyzer knows.
  op.profilingName = profilingName(launch.opType);
  if (launch.opType == c10d::OpType::SEND) {
    op.profilingName += " " + std::to_string(getRank()) + "->" + std::to_string(launch.peer);
  } else if (p2p) {
    op.profilingName += " " + std::to_string(getRank()) + "<-" + std::to_string(launch.peer);
  }
  op.p2p = p2p;
  op.collectiveSeq = collectiveSeq_;
  op.p2pSeq = p2pSeq_;
  op.opId = opId_;
  op.timeout = timeout;
  return recorder.record(recordedGroup(), std::move(op), launch.inputs.get(), launch.outputs,
                         clock);
}

void ProcessGroup::runTask(Work& work, const Steps& steps, Communicator& communicator,
                           c10::Stream opStream, Watchdog& watchdog, bool startsWithTask,
                           InflightWriteCheck* writes) {
  const OpInfo& info = work.info();
  // A failure breaks the group: its ranks can no longer be assumed in step.
  try {
    if (startsWithTask) {
      watchdog.health().recorder().started(info.traceId);
    }
    Kernels kernels(work.device(), writes ? &writes->group() : nullptr);
    steps.issue(communicator, kernels, opStream);
    if (steps.finish) {
      steps.finish(kernels);
    }
    if (writes) {
      writes->noteCompleted();  // before the future's callbacks, which may write the result
    }
    work.succeed();  // completed is recorded when its end event has passed
  } catch (...) {
    const std::exception_ptr cause = std::current_exception();
    watchdog.health().recorder().failed(info.traceId, describeException(cause));
    // The op fails once the group's dump is written: whoever learns of it finds the dump.
    watchdog.breakGroup(
        info, work.failureFor(cause),
        [&](const std::string& news) { work.fail(Watchdog::withNews(cause, news)); },
        Watchdog::BreakAs{isTimeout(cause) ? GroupHealth::Cause::Timeout
                                           : GroupHealth::Cause::Fault});
  }
}

c10::intrusive_ptr<Work> ProcessGroup::issue(Launch launch, Path& path, Steps steps,
                                             c10::intrusive_ptr<c10::ivalue::Future> future) {
  refuseIfBroken(launch.op);
  Device& device = *path.device;
  const c10::Stream current = device.currentStream();
  // Work captured into a CUDA graph runs at each replay, not now: nothing of it can be
  // waited for or queried from the host, so it is neither tracked nor timed. Nor may this
  // thread query events during its capture.
  const bool captured = device.isCapturing(current);
  if (captured) {
    // A lane still connecting would issue the op after the capture has ended.
    path.communicator->waitReady();
    path.communicator->noteCaptured();  // NCCL now ties the communicator to the graph
    // Its future is completed inside the capture, as its task issues it, not at a later ask.
    if (!future) {
      future = makeFuture(device);
    }
  }
  RecorderClock clock;  // one read dates the earlier ops' ends and this op's launch
  if (!captured) {
    watchdog_->releaseCompleted(clock);  // earlier ops that completed, recorded before this one
  }
  OpInfo info;
  info.name = launch.op;
  info.seq = ++seq_;
  info.rank = getRank();
  info.size = getSize();
  info.group = getGroupUid();
  const auto sizes = launch.shapeOf.sizes();
  info.shape.assign(sizes.begin(), sizes.end());
  info.dtype = launch.shapeOf.scalar_type();
  const auto timeout = launch.timeout == c10d::kUnsetTimeout ? options_->timeout : launch.timeout;
  info.traceId = trace(launch, timeout, clock);
  info.path = path.description;
  // Only async ops: a sync one has run, or is queued on the caller's own stream, when the call
  // returns. A captured op runs at replays, to which versions now say nothing.
  std::shared_ptr<InflightWriteCheck> writes;
  if (inflightWrites_ && launch.async && !captured) {
    writes = inflightWrites_->watch(info, launch.inputs.get(), launch.outputs);
  }
  if (options_->useDebugChecks()) {
    checkSameOpOnEveryRank(info, launch);
  }
  injectTestFault(info, steps);
  const uint64_t bytes = std::max(bytesOf(launch.inputs.get()), bytesOf(launch.outputs));

  const c10::Stream opStream = launch.async ? device.internalStream() : current;
  const bool blockHostOnWait = launch.blockHostOnWait || options_->useBlockingWait();
  std::vector<at::Tensor> inUse;
  if (launch.async) {
    inUse = std::move(launch.inputs).take();
    inUse.insert(inUse.end(), launch.outputs.begin(), launch.outputs.end());
  }
  auto work = c10::make_intrusive<Work>(std::move(info), launch.opType, path.device,
                                        std::move(launch.outputs), timeout, blockHostOnWait,
                                        watchdog_, std::move(future));
  work->setCommunicator(path.communicator.get());
  if (launch.sourceRank) {
    work->reportSourceRank(launch.sourceRank);
  }
  if (writes) {
    work->checkWrites(writes);
  }
  // Counted as in flight until the watchdog retires it (captured ops are never tracked).
  stats_->launched(launch.opType, bytes, /*tracked=*/!captured);

  // A captured op's steps are shared with its Work, whose replays use the temporaries they
  // hold; any other op's go with its task alone.
  std::shared_ptr<const Steps> held;
  if (captured) {
    held = std::make_shared<const Steps>(std::move(steps));
  }
  // Where the task runs when its stream reaches it (the host), its running is the op's start;
  // on CUDA it runs at issue, and the start is the start event's (the watchdog's to see).
  const bool startsWithTask = device.tasksRunInStreamOrder();
  // The task holds its Work (the op's outcome), communicator and steps until it has run,
  // whatever the caller drops: a device that keeps it (the host's worker, a lane still
  // connecting) takes the owning copy, one that runs it at once (CUDA) the borrowing one,
  // which costs no reference counts. Where writes are checked, the op's own are not the
  // caller's: what its kernels bump is credited to the group, and what its communicator
  // writes bumps no counter.
  std::shared_ptr<Communicator> unversioned;
  if (writes) {
    unversioned = std::make_shared<UnversionedCommunicator>(path.communicator);
  }
  const std::shared_ptr<Communicator>& communicator = writes ? unversioned : path.communicator;
  auto runNow = [&] {
    runTask(*work, held ? *held : steps, *communicator, opStream, *watchdog_, startsWithTask,
            writes.get());
  };
  auto keep = [&]() -> std::function<void()> {
    return [work, held, steps = std::move(steps), communicator, opStream, watchdog = watchdog_,
            startsWithTask, writes] {
      runTask(*work, held ? *held : steps, *communicator, opStream, *watchdog, startsWithTask,
              writes.get());
    };
  };
  Task task(runNow, keep);

  // Timed ops are timed on their stream, from an event before the op to its end event.
  const bool timed = timed_.load(std::memory_order_relaxed) && !captured;
  if (watchdog_->completionHooks().active()) {
    work->noteIssued(std::chrono::steady_clock::now());
  }
  if (!launch.async) {
    std::unique_ptr<Event> start;
    if (timed) {
      start = device.createTimedEvent();
      start->record(current);
    }
    device.enqueue(current, std::move(task));
    // A sync op has been issued (CUDA) or has run (host): a failure so far is raised here.
    if (auto failure = work->exception()) {
      if (!captured) {
        watchdog_->track(work);  // so that its end is counted, as failed
      }
      std::rethrow_exception(failure);
    }
    if (captured) {
      // On the caller's stream, like everything it uses: nothing to hold for the replays.
      return work;
    }
    // Its end is marked for the watchdog, so that a sync op stuck on the caller's stream
    // times out too; nothing ever waits on this event.
    auto end = timed ? device.createTimedEvent() : device.createEvent();
    end->record(current);
    work->setStart(std::move(start));
    work->setEnd(std::move(end), {}, /*joinOnWait=*/false);
    watchdog_->track(work);
    return work;
  }

  auto ready = device.createEvent();
  ready->record(current);
  ready->block(opStream);
  if (timed) {
    auto start = device.createTimedEvent();
    start->record(opStream);
    work->setStart(std::move(start));
  }
  device.enqueue(opStream, std::move(task));
  auto end = timed ? device.createTimedEvent() : device.createEvent();
  end->record(opStream);
  work->setEnd(std::move(end), std::move(inUse), /*joinOnWait=*/true);
  if (captured) {
    // The graph's kernels use the tensors, the factor and the temporaries at every replay; on
    // the internal stream, unordered with later work on the caller's stream until wait()
    // joins them. So the Work holds them all until then (the group, if it is never waited).
    work->markCaptured(held);
    watchdog_->trackCaptured(work);
    return work;
  }
  watchdog_->track(work);
  return work;
}

c10::intrusive_ptr<c10::ivalue::Future> ProcessGroup::makeFuture(const Device& device) {
  return c10::make_intrusive<c10::ivalue::Future>(tensorListType(), device.futureDevices());
}

void ProcessGroup::checkSameOpOnEveryRank(const OpInfo& info, const Launch& launch) {
  using c10d::OpType;
  const OpType opType = launch.opType;
  // Point-to-point ops, alone or batched, involve only some ranks: nothing to match.
  if (opType == OpType::SEND || opType == OpType::RECV || opType == OpType::COALESCED) {
    return;
  }
  TORCH_CHECK(store_, "streamnccl: debug checks need the group's Store");
  // Ops whose tensors may differ in shape between ranks are matched by name and dtype only.
  const bool shapesMatch = opType != OpType::ALLTOALL_BASE && opType != OpType::ALLTOALL &&
                           opType != OpType::GATHER && opType != OpType::SCATTER;
  std::ostringstream mine;
  mine << info.name << " (";
  if (shapesMatch) {
    mine << "[" << c10::Join(", ", info.shape) << "], ";
  }
  mine << c10::toString(info.dtype);
  if (opType == OpType::ALLTOALL_BASE) {
    // Without them NCCL's path may take ncclAlltoAll, which need not meet sends and recvs on
    // the other ranks (PointToPoint.cpp).
    const bool given = !launch.inputSplitSizes.empty() || !launch.outputSplitSizes.empty();
    mine << (given ? ", split sizes given" : ", no split sizes");
  }
  mine << ")";
  const std::string prefix = keys::debugCheck(++checkedCollectives_);
  const std::string text = mine.str();
  store_->set(prefix + std::to_string(getRank()), std::vector<uint8_t>(text.begin(), text.end()));
  for (const auto peer : c10::irange(getSize())) {
    if (peer == getRank()) {
      continue;
    }
    const auto bytes = store_->get(prefix + std::to_string(peer));
    const std::string theirs(bytes.begin(), bytes.end());
    if (theirs != text) {
      auto error =
          makeDistBackendError(info.describe() + ": debug check failed: this rank issued " + text +
                               " but rank " + std::to_string(peer) + " issued " + theirs +
                               " as collective #" + std::to_string(checkedCollectives_));
      health_->recorder().failed(info.traceId, describeException(error));
      watchdog_->breakGroup(groupInfo(), error);
      std::rethrow_exception(error);
    }
  }
}

void ProcessGroup::injectTestFault(const OpInfo& info, Steps& steps) const {
  const auto& fault = options_->testFault;
  if (!fault || fault->rank != getRank() || fault->op != info.seq) {
    return;
  }
  auto issue = std::move(steps.issue);
  if (fault->fail) {
    steps.issue = [](Communicator&, Kernels&, c10::Stream) {
      throwDistBackendError("injected fault (STREAMNCCL_TEST_FAULT)");
    };
  } else {
    steps.issue = [issue, delay = fault->delay](Communicator& comm, Kernels& kernels,
                                                c10::Stream stream) {
      std::this_thread::sleep_for(delay);
      issue(comm, kernels, stream);
    };
  }
}

void ProcessGroup::startCoalescing() {
  TORCH_CHECK_VALUE(!coalescing_,
                    "streamnccl startCoalescing: already coalescing; "
                    "end the open group with endCoalescing() first");
  coalescing_.emplace();
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::endCoalescing() {
  TORCH_CHECK_VALUE(coalescing_,
                    "streamnccl endCoalescing: no group was started "
                    "(call startCoalescing() first)");
  Coalesced group = std::move(*coalescing_);
  coalescing_.reset();
  if (group.steps.empty()) {
    auto done = c10::make_intrusive<c10::ivalue::Future>(tensorListType());
    done->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return c10d::Work::create_from_future(done);
  }
  const at::Tensor shapeOf = group.inputs.empty() ? group.outputs.front() : group.inputs.front();
  Steps combined{[steps = group.steps](Communicator& comm, Kernels& kernels, c10::Stream stream) {
                   CommunicatorGroup group(comm);
                   for (const auto& step : steps) {
                     step.issue(comm, kernels, stream);
                   }
                   group.end();
                 },
                 [steps = group.steps](Kernels& kernels) {
                   for (const auto& step : steps) {
                     if (step.finish) {
                       step.finish(kernels);
                     }
                   }
                 }};
  try {
    return launch({"coalesced", c10d::OpType::COALESCED, shapeOf, std::move(group.inputs),
                   std::move(group.outputs), /*async=*/true, c10d::kUnsetTimeout},
                  *group.path, std::move(combined), group.future);
  } catch (...) {
    // Refused before it was issued (the group broken, the ranks' ops found to differ): the
    // Works its ops handed out wait on this future, and must not wait for ever.
    group.future->setErrorIfNeeded(std::current_exception());
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::coalesce(const std::function<void()>& record) {
  const bool outer = !coalescing_;
  if (outer) {
    startCoalescing();
  }
  try {
    record();
  } catch (...) {
    if (outer) {
      coalescing_.reset();
    }
    throw;
  }
  if (outer) {
    return endCoalescing();
  }
  return c10d::Work::create_from_future(coalescing_->future);
}

}  // namespace streamnccl
