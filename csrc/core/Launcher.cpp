#include "core/Launcher.hpp"

#include "core/Errors.hpp"

#include <c10/util/SmallVector.h>

namespace streamnccl {

bool isPointToPoint(c10d::OpType opType) {
  return opType == c10d::OpType::SEND || opType == c10d::OpType::RECV ||
         opType == c10d::OpType::RECVANYSOURCE;
}

// One op from its Work being made to its enqueueing.
struct Launcher::Issued {
  Device& device;
  c10::Stream current;   // the caller's
  c10::Stream opStream;  // the caller's (sync), the group's internal one (async)
  bool captured;
  bool timed;  // an event before the op as well as after
  c10::intrusive_ptr<Work>& work;
  Steps& steps;
  // A captured op's steps, shared with its Work, whose replays use the temporaries they hold;
  // any other op's go with its task alone.
  std::shared_ptr<const Steps> held;
  const std::shared_ptr<Communicator>& communicator;
  const std::shared_ptr<Watchdog>& watchdog;
};

Launcher::Launcher(const c10d::Backend& group, const Options& options,
                   std::shared_ptr<Watchdog> watchdog, LaunchHooks hooks)
    : group_(group), options_(options), watchdog_(std::move(watchdog)), hooks_(std::move(hooks)) {
  timed_.store(options_.useTiming());
}

c10::intrusive_ptr<c10::ivalue::Future> Launcher::makeFuture(const Device& device) {
  return c10::make_intrusive<c10::ivalue::Future>(tensorListType(), device.futureDevices());
}

OpInfo Launcher::describe(const Launch& launch, const Path& path) {
  OpInfo info;
  info.name = launch.op;
  info.seq = ++seq_;
  info.rank = group_.getRank();
  info.size = group_.getSize();
  info.group = group_.getGroupUid();
  const auto sizes = launch.shapeOf.sizes();
  info.shape.assign(sizes.begin(), sizes.end());
  info.dtype = launch.shapeOf.scalar_type();
  info.path = path.description;
  return info;
}

void Launcher::enterCapture(Path& path, c10::intrusive_ptr<c10::ivalue::Future>& future) {
  path.communicator->waitReady();     // a lane still connecting would issue after the capture
  path.communicator->noteCaptured();  // NCCL now ties the communicator to the graph
  if (!future) {
    future = makeFuture(*path.device);  // completed inside the capture, as its task issues it
  }
}

c10::intrusive_ptr<Work> Launcher::launch(Launch launch, Path& path, Steps steps,
                                          c10::intrusive_ptr<c10::ivalue::Future> future) {
  Device& device = *path.device;
  const c10::Stream current = device.currentStream();
  // Work captured into a CUDA graph runs at each replay, not now: nothing of it can be
  // waited for or queried from the host, so it is neither tracked nor timed. Nor may this
  // thread query events during its capture.
  const bool captured = device.isCapturing(current);
  if (captured) {
    enterCapture(path, future);
  }
  RecorderClock clock;  // one read dates the earlier ops' ends and this op's launch
  if (!captured) {
    // Earlier ops that completed, recorded before this one; the look goes no further than a
    // running op on each stream, so that it costs the same with 10 or 10,000 ops queued.
    watchdog_->releaseCompleted(clock, Watchdog::Look::UntilEachStreamRuns);
  }
  const auto timeout = launch.timeout == c10d::kUnsetTimeout ? options_.timeout : launch.timeout;
  OpInfo info = describe(launch, path);
  // Made before any hook counts the op: the first ask may make the stream, and fail.
  const c10::Stream opStream = launch.async ? device.internalStream() : current;
  LaunchedOp op{launch, info, steps, path, captured, timeout, clock};
  c10::SmallVector<std::shared_ptr<void>, 1> scopes;  // what hooks keep until the launch returns
  for (const auto& hook : hooks_) {
    if (auto scope = hook->launched(op)) {
      scopes.push_back(std::move(scope));
    }
  }
  auto work = c10::make_intrusive<Work>(
      std::move(info), launch.opType, path.device, std::move(launch.outputs), timeout,
      launch.blockHostOnWait || options_.useBlockingWait(), watchdog_, std::move(future));
  work->setCommunicator(path.communicator.get());
  if (launch.sourceRank) {
    work->reportSourceRank(launch.sourceRank);
  }
  for (const auto& hook : hooks_) {
    hook->issued(op, *work);
  }
  Issued issued{device,
                current,
                opStream,
                captured,
                timed_.load(std::memory_order_relaxed) && !captured,
                work,
                steps,
                nullptr,
                path.communicator,
                watchdog_};
  if (captured) {
    issued.held = std::make_shared<const Steps>(std::move(steps));
  }
  if (!launch.async) {
    enqueueSync(issued);
    return work;
  }
  std::vector<at::Tensor> inUse = std::move(launch.inputs).take();
  inUse.insert(inUse.end(), work->outputs().begin(), work->outputs().end());
  enqueueAsync(issued, std::move(inUse));
  return work;
}

// Rule 1: on the caller's stream, with an end event the watchdog watches.
void Launcher::enqueueSync(Issued& op) {
  std::unique_ptr<Event> start;
  if (op.timed) {
    start = op.device.createTimedEvent();
    start->record(op.current);
  }
  enqueue(op, op.current);
  // A sync op has been issued (CUDA) or has run (host): a failure so far is raised here.
  if (auto failure = op.work->exception()) {
    if (!op.captured) {
      watchdog_->track(op.work);  // so that its end is counted, as failed
    }
    std::rethrow_exception(failure);
  }
  if (op.captured) {
    return;  // on the caller's stream, like everything it uses: nothing to hold for the replays
  }
  // Its end is marked for the watchdog, so that a sync op stuck on the caller's stream
  // times out too; nothing ever waits on this event.
  auto end = op.timed ? op.device.createTimedEvent() : op.device.createEvent();
  end->record(op.current);
  op.work->setStart(std::move(start));
  op.work->setEnd(op.current, std::move(end), {}, /*joinOnWait=*/false);
  watchdog_->track(op.work);
}

// Rule 2: on the internal stream, after the caller's; its Work holds its tensors to its end.
void Launcher::enqueueAsync(Issued& op, std::vector<at::Tensor> inUse) {
  auto ready = op.device.createEvent();
  ready->record(op.current);
  ready->block(op.opStream);
  if (op.timed) {
    auto start = op.device.createTimedEvent();
    start->record(op.opStream);
    op.work->setStart(std::move(start));
  }
  enqueue(op, op.opStream);
  auto end = op.timed ? op.device.createTimedEvent() : op.device.createEvent();
  end->record(op.opStream);
  op.work->setEnd(op.opStream, std::move(end), std::move(inUse), /*joinOnWait=*/true);
  if (op.captured) {
    // The graph's kernels use the tensors, the factor and the temporaries at every replay; on
    // the internal stream, unordered with later work on the caller's stream until wait()
    // joins them. So the Work holds them all until then (the group, if it is never waited).
    op.work->markCaptured(op.held);
    watchdog_->trackCaptured(op.work);
    return;
  }
  watchdog_->track(op.work);
}

// The task holds its Work (the op's outcome), communicator and steps until it has run,
// whatever the caller drops: a device that keeps it (the host's worker, a lane still
// connecting) takes the owning copy, one that runs it at once (CUDA) the borrowing one, which
// costs no reference counts.
void Launcher::enqueue(Issued& op, c10::Stream stream) {
  // Where the task runs when its stream reaches it (the host), its running is the op's start;
  // on CUDA it runs at issue, and the start is the start event's (the watchdog's to see).
  const bool startsWithTask = op.device.tasksRunInStreamOrder();
  const Steps& steps = op.held ? *op.held : op.steps;
  auto runNow = [&] {
    runTask(*op.work, steps, *op.communicator, stream, *op.watchdog, startsWithTask);
  };
  auto keep = [&]() -> std::function<void()> {
    return [work = op.work, held = op.held, steps = std::move(op.steps),
            communicator = op.communicator, stream, watchdog = op.watchdog, startsWithTask] {
      runTask(*work, held ? *held : steps, *communicator, stream, *watchdog, startsWithTask);
    };
  };
  op.device.enqueue(stream, Task(runNow, keep));
}

void Launcher::runTask(Work& work, const Steps& steps, Communicator& communicator,
                       c10::Stream opStream, Watchdog& watchdog, bool startsWithTask) {
  try {
    if (startsWithTask) {
      watchdog.health().recorder().started(work.info().traceId);
    }
    Kernels kernels(work.device());
    steps.issue(communicator, kernels, opStream);
  } catch (...) {
    failTask(work, watchdog, std::current_exception());
    // What it posted before it failed is still seen through on the stream, whose failure is
    // this op's, not the next one's to settle.
    work.device().afterCalls(opStream, [](std::exception_ptr /*failed: told already*/) {});
    return;
  }
  // Settled after the calls: at once where they complete on the stream (CUDA), else once they
  // have (the host's Gloo). Kept, it owns what it uses: the task that issued it is gone by then.
  auto settleNow = [&](std::exception_ptr failed) { settle(work, steps, watchdog, failed); };
  auto keep = [&]() -> std::function<void(std::exception_ptr)> {
    return [work = c10::intrusive_ptr<Work>::reclaim_copy(&work), steps,
            watchdog = watchdog.shared_from_this()](std::exception_ptr failed) {
      settle(*work, steps, *watchdog, failed);
    };
  };
  work.device().afterCalls(opStream, Settle(settleNow, keep));
}

void Launcher::settle(Work& work, const Steps& steps, Watchdog& watchdog,
                      std::exception_ptr failed) {
  try {
    if (failed) {
      std::rethrow_exception(failed);
    }
    if (steps.finish) {
      Kernels kernels(work.device());
      steps.finish(kernels);
    }
    work.succeed();  // completed is recorded when its end event has passed
  } catch (...) {
    failTask(work, watchdog, std::current_exception());
  }
}

// A failure breaks the group: its ranks can no longer be assumed in step.
void Launcher::failTask(Work& work, Watchdog& watchdog, std::exception_ptr cause) {
  const OpInfo& info = work.info();
  watchdog.health().recorder().failed(info.traceId, describeException(cause));
  // The op fails once the group's dump is written: whoever learns of it finds the dump.
  watchdog.breakGroup(
      info, work.failureFor(cause),
      [&](const std::string& news) { work.fail(Watchdog::withNews(cause, news)); },
      Watchdog::BreakAs{isTimeout(cause) ? GroupHealth::Cause::Timeout
                                         : GroupHealth::Cause::Fault});
}

}  // namespace streamnccl
