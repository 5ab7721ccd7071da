# ruff: noqa: E501  (the mutants quote whole lines of C++)
"""Mutation audit of the production code (csrc/core, csrc/cuda, csrc/host): each mutant plants one defect,
the extension is rebuilt, and the no-GPU tests run against it. A mutant must be caught by a
behaviour test (a value, a violation the fake GPU reports, an error), not only by a test that
pins an exact call log; the report says which caught it.

    python scripts/mutation_audit.py [--only NAME ...] [--changed-since REV] [--list] [--json FILE]

After a refactor, `--changed-since REV` chooses the mutants of the files changed since REV (the
ones whose catch the refactor may have moved); `--list` prints the chosen names and runs none.

It edits csrc/ in place and rebuilds in place (restoring every file afterwards), so run it in a
checkout of its own: `git worktree add ../audit && cd ../audit`, with PYTHONPATH=python so that
the tests import the extension built there. One mutant takes a few minutes on two cores.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Behaviour tests: values, the fake GPU's violations, errors. The exact call logs of
# tests/test_cuda_call_sequences.py run only for mutants these miss.
BEHAVIOUR = [
    "tests/test_nccl_lifecycle.py",
    "tests/test_nccl_path_semantics.py",
    "tests/test_fake_models.py::test_memory_a_read_of_freed_memory_is_reported",
    "tests/test_fake_models.py::test_capture_a_prohibited_query_invalidates_it",
    "tests/test_fake_models.py::test_aten_kernels_run_in_stream_order",
    "tests/test_fake_models.py::test_peers_a_send_completes_only_with_its_recv",
    "tests/test_fake_models.py::test_in_progress_a_group_end_can_be_still_enqueueing",
    "tests/test_teardown.py",
    "tests/test_work.py",
    "tests/test_ordering_sim.py",
    "tests/test_faults.py",
    "tests/test_inflight_writes.py",
    "tests/test_nccl_all_to_all.py",
    "tests/test_nccl_shrink.py",
    "tests/test_nccl_split.py",
    "tests/test_propagation.py",
    "tests/test_completion_hooks.py",
    "tests/test_host_stream.py",
]
CALL_LOGS = ["tests/test_cuda_call_sequences.py"]


@dataclass
class Mutant:
    name: str
    what: str
    file: str
    edits: list  # (old, new) pairs, each `old` found exactly once in `file`
    more: tuple = ()  # (file, old, new) edits of other files


MUTANTS = [
    # --- the defects of issue 16, planted again
    Mutant("wait-releases-before-end", "wait() lets go of the tensors before the op's end",
           "csrc/core/Work.cpp",
           [("  } else if (holding_.load(std::memory_order_acquire) && pollEnd() == EndState::Passed) {\n    releaseTensors();",
             "  } else {\n    releaseTensors();")]),
    Mutant("future-before-finish", "the future completes before the op's finish kernels",
           "csrc/core/Launcher.cpp",
           [("      std::rethrow_exception(failed);\n    }\n    if (steps.finish) {\n",
             "      std::rethrow_exception(failed);\n    }\n    work.succeed();\n"
             "    if (steps.finish) {\n")]),
    Mutant("late-future-not-after-the-op", "a future asked for after its op settled follows nothing",
           "csrc/cuda/CudaDevice.cpp",
           [("  end.block(*lateFutures_);\n", "")]),
    Mutant("late-future-ignores-failure", "a future asked for after its op failed reports success",
           "csrc/core/Work.cpp",
           [("    settledWith = outcome == Outcome::Failed ? failure_ : nullptr;",
             "    settledWith = nullptr;")]),
    Mutant("unlaunched-coalesced-future-pending", "a coalesced group refused at its end leaves its Works' future pending",
           "csrc/core/GroupCoalescing.cpp",
           [("    group.future->setErrorIfNeeded(std::current_exception());\n", "")]),
    Mutant("closed-coalesced-future-pending", "a coalesced group open at shutdown leaves its Works' future pending",
           "csrc/core/ProcessGroup.cpp",
           [("      coalescing_->future->setErrorIfNeeded(makeDistBackendError(why));\n", "")]),
    Mutant("future-not-device-aware", "futures name no device", "csrc/cuda/CudaDevice.hpp",
           [("{ return cuda_->futureDevices(device_); }", "{ return {}; }")]),
    Mutant("synchronize-does-nothing", "Work::synchronize() joins nothing", "csrc/core/Work.cpp",
           [("void Work::synchronize() {\n  joinCurrentStream();",
             "void Work::synchronize() {\n  return;\n  joinCurrentStream();")]),
    Mutant("destroy-aborts-in-flight", "teardown aborts instead of finishing the ops in flight",
           "csrc/core/GroupTeardown.cpp",
           [("  const bool finished = watchdog->finish(deadline);",
             "  const bool finished = false;")]),
    Mutant("captured-op-holds-nothing", "a captured op's Work holds nothing",
           "csrc/core/Launcher.cpp",
           [("    op.work->markCaptured(op.held);",
             "    op.work->releaseTensors();\n    op.work->markCaptured(nullptr);")]),
    Mutant("failed-released-before-end", "failed ops are let go before their end",
           "csrc/core/Watchdog.cpp",
           [("\n  append(failedRunning_, works);\n}", "\n  append(ended_, works);\n}")]),
    # Both guards: an event query's error kept as the op's (Work::pollEnd), and the loop's.
    Mutant("watchdog-without-try-catch", "the watchdog lets a CUDA error escape its thread",
           "csrc/core/Work.cpp",
           [("  } catch (...) {\n    std::lock_guard<std::mutex> lock(mutex_);  // deviceError()",
             "  } catch (const c10::IndexError&) {\n    std::lock_guard<std::mutex> lock(mutex_);  // deviceError()")],
           (("csrc/core/Watchdog.cpp", "  try {\n    check();\n  } catch (...) {",
             "  check();\n  if (false) {"),)),
    Mutant("band-accepted-on-cuda", "BAND/BOR/BXOR pass the checks on CUDA",
           "csrc/cuda/NcclCommunicator.cpp",
           [("  if (kind == ReduceKind::BitAnd || kind == ReduceKind::BitOr || kind == ReduceKind::BitXor) {",
             "  if (false) {")]),
    # --- the stream contract
    Mutant("no-ready-wait", "the internal stream does not wait for the caller's work",
           "csrc/core/Launcher.cpp", [("  ready->block(op.opStream);\n", "")]),
    Mutant("async-work-holds-nothing", "an async op's Work holds no tensors",
           "csrc/core/Launcher.cpp",
           [("  op.work->setEnd(op.opStream, std::move(end), std::move(inUse), /*joinOnWait=*/true);",
             "  op.work->setEnd(op.opStream, std::move(end), {}, /*joinOnWait=*/true);")]),
    Mutant("wait-joins-internal-stream", "wait() makes the internal stream wait, not the caller's",
           "csrc/core/Work.cpp",
           [("  refuseWaitInsideCapture(current);\n  end_->block(current);",
             "  refuseWaitInsideCapture(current);\n  end_->block(device_->internalStream());")]),
    Mutant("op-stream-not-current", "the task runs without the op's stream current",
           "csrc/cuda/CudaDevice.cpp", [("  CurrentStreamGuard guard(cuda, stream);\n", "")]),
    Mutant("task-without-device", "the task runs without the group's device current",
           "csrc/cuda/CudaDevice.cpp",
           [("  auto onDevice = cuda.useDevice(device);\n  CurrentStreamGuard",
             "  CurrentStreamGuard")]),
    Mutant("sync-op-not-watched", "a sync op's end is not tracked", "csrc/core/Launcher.cpp",
           [("  op.work->setEnd(op.current, std::move(end), {}, /*joinOnWait=*/false);\n"
             "  watchdog_->track(op.work);",
             "  op.work->setEnd(op.current, std::move(end), {}, /*joinOnWait=*/false);")]),
    # --- lowering and kernels
    Mutant("allgather-buffers-swapped", "ncclAllGather is given the output as its send buffer",
           "csrc/cuda/NcclCommunicator.cpp",
           [("nccl_->allGather(input.data_ptr(), output.data_ptr(),",
             "nccl_->allGather(output.data_ptr(), output.data_ptr(),")]),
    Mutant("reduce-scatter-count", "ncclReduceScatter is given the input's count",
           "csrc/cuda/NcclCommunicator.cpp",
           [("nccl_->reduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type,",
             "nccl_->reduceScatter(input.data_ptr(), output.data_ptr(), input.numel(), type,")]),
    Mutant("premul-residence-swapped", "a host factor is declared device-resident",
           "csrc/cuda/NcclCommunicator.cpp",
           [("op.factorOnHost ? ncclScalarHostImmediate : ncclScalarDevice",
             "op.factorOnHost ? ncclScalarDevice : ncclScalarHostImmediate")]),
    Mutant("avg-not-divided", "AVG's division is skipped", "csrc/core/Lowering.cpp",
           [("    kernels.divide(result, size);", "    (void)size;")]),
    Mutant("no-copy-back", "results computed in a copy are not copied back",
           "csrc/core/Lowering.cpp", [("    kernels.copy(target, computed);", "    (void)computed;")]),
    Mutant("contiguous-is-identity", "a non-contiguous tensor is handed on as it is",
           "csrc/core/Kernels.cpp", [("  if (tensor.is_contiguous()) {", "  if (true) {")]),
    Mutant("group-left-open", "a failing call leaves NCCL's group open", "csrc/core/Communicator.hpp",
           [("      try {\n        communicator_.groupEnd();\n      } catch (...) {",
             "      try {\n      } catch (...) {")]),
    # --- the NCCL connection
    Mutant("in-progress-not-polled", "a call that returned ncclInProgress is not waited for",
           "csrc/cuda/NcclConnection.cpp",
           [("  if (result == ncclInProgress) {\n    // A non-blocking communicator is still enqueueing",
             "  if (result == ncclInProgress) {\n    result = ncclSuccess;\n  }\n  if (false) {\n    // A non-blocking communicator is still enqueueing")]),
    Mutant("close-skips-finalize", "teardown destroys without finalizing",
           "csrc/cuda/NcclConnection.cpp",
           [("    result = nccl().commFinalize(comm);", "    result = ncclSuccess;")]),
    Mutant("abort-without-waiting-uses", "abort frees the communicator under a call in progress",
           "csrc/cuda/NcclConnection.cpp",
           [("    // non-blocking communicator return at once.\n    if (!changed_.wait_for(lock, kAbortGrace, [&] { return noUseInProgress(); })) {",
             "    if (false) {")]),
    Mutant("abort-ignores-lock-free-uses", "abort frees the communicator under a call that took no lock",
           "csrc/cuda/NcclConnection.cpp",
           [("return uses_ == 0 && fastUses_.load() == 0;", "return uses_ == 0;")]),
    # --- the watchdog and teardown
    Mutant("timeouts-ignored", "the watchdog times nothing out", "csrc/core/Watchdog.cpp",
           [("return work.expiredBy(now);", "return false && work.expiredBy(now);")]),
    Mutant("device-error-fails-before-dump",
           "a caller meeting an op's device error fails it before the group's dump is written",
           "csrc/core/Work.cpp",
           [("    watchdog->failOnDeviceError(*this, cause);", "    fail(cause);")]),
    Mutant("is-completed-waits-for-the-dump",
           "is_completed() meeting a device error breaks the group and waits for its dump",
           "csrc/core/Work.cpp",
           [("    if (!watchdog_.expired()) {\n",
             "    if (!watchdog_.expired()) {\n      reportDeviceError(deviceError());\n"
             "      return true;\n")]),
    Mutant("dump-waited-for-without-bound", "a dump that never ends keeps every op from failing",
           "csrc/core/GroupHealth.cpp",
           [("  if (!outcome->done.wait_for(lock, kEvidenceWait, [&] { return outcome->where.has_value(); })) {",
             "  outcome->done.wait(lock, [&] { return outcome->where.has_value(); });\n  if (false) {")]),
    Mutant("teardown-lets-stranded-ops-go",
           "a teardown during a break on another thread lets the ops in flight go at once",
           "csrc/core/Watchdog.cpp",
           [("    stranded = inFlight_.takeAll();\n    taken",
             "    Works all = inFlight_.takeAll();\n    append(ended_, all);\n    taken")]),
    Mutant("failed-before-dump", "an op fails before the group's dump is written",
           "csrc/core/Watchdog.cpp",
           [("  const bool broke = health_->claimBreak();",
             "  if (failCause) {\n    failCause(\"\");\n  }\n"
             "  const bool broke = health_->claimBreak();")]),
    Mutant("blocking-wait-keeps-the-gil", "a wait() that blocks keeps the GIL",
           "csrc/core/Work.cpp",
           [("  return !waitLooksAtEnd(timeout) && !captured_ && !writes_;", "  return true;")]),
    Mutant("timed-wait-keeps-the-gil", "a sync op's wait(timeout) keeps the GIL while it blocks",
           "csrc/core/Work.cpp",
           [("  return !waitLooksAtEnd(timeout) && !captured_ && !writes_;",
             "  return !waitLooksAtEnd(kNoTimeout) && !captured_ && !writes_;")]),
    Mutant("blocking-wait-mode-keeps-the-gil", "a sync op's wait() under blocking_wait keeps the GIL",
           "csrc/core/Work.cpp",
           [("  return !waitLooksAtEnd(timeout) && !captured_ && !writes_;",
             "  return timeout == kNoTimeout && !joinOnWait_ && !captured_ && !writes_ &&\n"
             "         !holding_.load(std::memory_order_acquire);")]),
    Mutant("async-errors-ignored", "asynchronous NCCL errors are not polled",
           "csrc/core/Watchdog.cpp",
           [("    if (std::string error = communicator->asyncError(); !error.empty()) {",
             "    if (std::string error; !error.empty()) {")]),
    Mutant("break-not-shared", "a break is never posted for the other ranks",
           "csrc/core/Watchdog.cpp",
           [("  if (!board_ || !as.shared) {", "  if (true) {")]),
    Mutant("posted-break-ignored", "a break another rank posted is found but never made here",
           "csrc/core/Watchdog.cpp",
           [("    if (auto post = board_->takePosted()) {",
             "    if (auto post = board_->takePosted(); false) {")]),
    Mutant("hooks-never-told", "a completed op is never handed to the completion hooks",
           "csrc/core/Watchdog.cpp",
           [("    if (hooks_->active()) {", "    if (false) {")]),
    Mutant("break-does-not-abort", "breaking the group aborts no communicator",
           "csrc/core/Watchdog.cpp",
           [("  if (as.kernels == Kernels::Abort) {\n    abortCommunicators();", "  if (false) {\n    abortCommunicators();")]),
    Mutant("completed-never-released", "a completed op's Work keeps its tensors",
           "csrc/core/Watchdog.cpp",
           [("    clock.reset();\n  }\n  for (auto& work : released) {\n    work->releaseTensors();\n  }",
             "    clock.reset();\n  }")]),
    Mutant("started-at-issue", "the flight recorder marks an op started when it is issued",
           "csrc/core/Launcher.cpp",
           [("  const bool startsWithTask = op.device.tasksRunInStreamOrder();",
             "  const bool startsWithTask = true;")]),
    Mutant("captured-op-tracked", "a captured op is watched (its events queried)",
           "csrc/core/Launcher.cpp",
           [("    op.work->markCaptured(op.held);\n    watchdog_->trackCaptured(op.work);\n    return;",
             "    watchdog_->track(op.work);\n    return;")]),
    Mutant("shared-gate-unused", "one hardware queue: the lanes keep gates of their own",
           "csrc/cuda/CudaPath.cpp",
           [("auto gate = oneQueue ? sharedGate : std::make_shared<StreamGate>();",
             "auto gate = std::make_shared<StreamGate>();")]),
    Mutant("refuse-after-shutdown-missing", "a shut-down group takes new ops",
           "csrc/core/ProcessGroup.cpp",
           [("  if (closed()) {", "  if (false) {")]),
    Mutant("wait-inside-capture-not-refused", "wait() inside a capture queries an outside op",
           "csrc/core/Work.cpp",
           [("  STREAMNCCL_CHECK_ARG(captured_ || !device_->isCapturing(current), info_.name,",
             "  STREAMNCCL_CHECK_ARG(true, info_.name,")]),
    Mutant("capture-mode-not-thread-local", "the watchdog queries in the global capture mode",
           "csrc/cuda/CudaDevice.cpp",
           [("      : cuda_(cuda), previous_(cuda.exchangeCaptureMode(cudaStreamCaptureModeThreadLocal)) {}",
             "      : cuda_(cuda), previous_(cuda.exchangeCaptureMode(cudaStreamCaptureModeGlobal)) {}")]),
    # --- the second review's findings
    Mutant("graph-held-comm-finalized", "teardown finalizes a communicator a CUDA graph holds",
           "csrc/cuda/NcclConnection.cpp",
           [("    if (captured_) {\n      // NCCL finalizes", "    if (false) {\n      // NCCL finalizes")]),
    Mutant("graph-held-comm-never-aborted", "abort() leaves a communicator a graph holds running",
           "csrc/cuda/NcclConnection.cpp",
           [("    std::thread(std::move(abortComm)).detach();\n    noteAbort(End::AbortLeftRunning);",
             "    noteAbort(End::AbortLeftRunning);")]),
    Mutant("single-queue-lanes-unready", "one hardware queue: first lane contact does not wait",
           "csrc/core/ProcessGroup.cpp",
           [("    lanes.sends->communicator->waitReady();\n    lanes.receives->communicator->waitReady();\n", "")]),
    Mutant("failed-grace-already-over", "after an abort, failed ops get no time to pass their end",
           "csrc/core/GroupTeardown.cpp",
           [("watchdog->releaseAll(Watchdog::Clock::now() + grace)", "watchdog->releaseAll(Watchdog::Clock::now())")]),
    Mutant("gate-issues-out-of-order", "a lane's held-back work is issued newest first",
           "csrc/cuda/CudaDevice.cpp",
           [("      issue = std::move(waiting_.front());\n      waiting_.pop_front();",
             "      issue = std::move(waiting_.back());\n      waiting_.pop_back();")]),
    # --- the in-flight write detector (STREAMNCCL_CHECK_INFLIGHT_WRITES)
    Mutant("inflight-writes-unchecked", "async ops record no versions: writes in flight pass",
           "csrc/core/hooks/InflightWritesWatch.cpp",
           [("    if (!op.launch.async || op.captured) {", "    if (true) {")]),
    Mutant("inflight-own-writes-blamed", "an op's own kernels are not credited: false alarms",
           "csrc/core/Kernels.cpp",
           [("  if (ownWrites_ == nullptr) {", "  if (true) {")]),
    # --- the defects of issue 34, planted again
    Mutant("shrink-abort-breaks-late", "a shrink with SHRINK_ABORT stops the old ops' kernels before the old group breaks",
           "csrc/core/GroupSubgroups.cpp",
           [("  if (abortInFlight) {\n    // NCCL's shrink stops", "  if (false) {\n    // NCCL's shrink stops")],
           (("csrc/core/GroupSubgroups.cpp", "      watchdog_->abortCommunicators();  // also when the shrink failed",
             "      watchdog_->breakGroup(groupInfo(), makeDistBackendError(who() + \" shrunk with SHRINK_ABORT\"));"),)),
    Mutant("failed-child-aborts-parent-alone", "a failed split or shrink aborts the parent without breaking its group",
           "csrc/cuda/NcclConnectionChild.cpp",
           [("  if (request) {\n    request(who() + \" \" + why);", "  if (false) {\n    request(who() + \" \" + why);")]),
    Mutant("failed-child-freed-first", "a communicator that failed to be made is freed before its parent's abort",
           "csrc/cuda/NcclConnectionChild.cpp",
           [("    if (result != ncclSuccess && started) {", "    if (false) {")]),
    Mutant("state-polled-under-a-use", "the watchdog polls a communicator's state while a call on it is in progress",
           "csrc/cuda/NcclConnection.cpp",
           [("    if (!noUseInProgress()) {\n      --statePolls_;", "    if (false) {\n      --statePolls_;")]),
    Mutant("block-current-stream-default", "Work.block_current_stream() is c10d's, released by a future complete at issue",
           "csrc/core/Work.hpp",
           [("  void blockCurrentStream() override { synchronize(); }", "")]),
    Mutant("waited-op-stays-registered", "a waited op stays in torch's registry of ops in flight",
           "csrc/core/Work.cpp",
           [("  if (c10d::allow_inflight_collective_as_graph_input()) {", "  if (false) {")]),
    Mutant("shrink-asks-the-store-for-nothing", "a shrink (or split) with no communicator open still agrees through the Store",
           "csrc/cuda/CudaPath.cpp",
           [("  if (byKey.empty()) {\n    return paths;\n  }\n  const std::set<std::string> live =",
             "  const std::set<std::string> live =")]),
    Mutant("split-over-ops-in-flight", "a split or a SHRINK_DEFAULT starts with the parent's ops still in flight",
           "csrc/core/GroupSubgroups.cpp",
           [("  if (communicators.empty() ||", "  if (true ||")]),
    # --- the seams between a parent communicator and the ones made from it
    Mutant("child-without-device-guard", "a split or shrink is called with no current device",
           "csrc/cuda/NcclConnectionChild.cpp",
           [("ncclComm_t* into) {\n  auto onDevice = settings_.cuda->useDevice(settings_.device);", "ncclComm_t* into) {")]),
    Mutant("broken-parent-counted-live", "a parent broken on this rank is offered for a shrink",
           "csrc/cuda/CudaPath.cpp",
           [("    if (opened.second->live()) {", "    if (true) {")]),
    # --- all_to_all_single: ncclAlltoAll (NCCL 2.28+)
    Mutant("all-to-all-in-place", "all_to_all_single(x, x) hands NCCL one buffer as both",
           "csrc/core/PointToPoint.cpp",
           [("  const bool outputOverInput = at::get_overlap_status(input, output) != "
             "at::MemOverlapStatus::No;", "  const bool outputOverInput = false;")]),
    Mutant("all-to-all-any-nccl", "ncclAlltoAll is called on an NCCL without it",
           "csrc/cuda/NcclCommunicator.cpp",
           [("      allToAllLoaded_(nccl_->hasAllToAll()),\n      connection_(NcclConnection::open(",
             "      allToAllLoaded_(true),\n      connection_(NcclConnection::open(")]),
    # --- the host stream (issue 37): ops post to Gloo and settle once it has completed them
    Mutant("host-stream-runs-past-pending-calls", "the host stream runs the next op before the calls before it complete",
           "csrc/host/HostStream.cpp",
           [("    if (s.pending > 0 || s.items.empty()) {\n      s.holder = Holder::Free;",
             "    if (s.items.empty()) {\n      s.holder = Holder::Free;")]),
    Mutant("host-settle-before-calls-complete", "a host op settles as soon as its calls are posted",
           "csrc/host/HostStream.cpp",
           [("  if (s.pending == 0) {\n    auto failure = std::exchange(s.failure, nullptr);",
             "  if (true) {\n    auto failure = std::exchange(s.failure, nullptr);")]),
    Mutant("host-abort-leaves-waits", "a break leaves the waits for sends and receives to Gloo's timeout",
           "csrc/host/HostCommunicator.cpp",
           [("    stream_->abortCalls();\n", "")]),
]  # fmt: skip


def run(command, timeout, env=None):
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=env)  # fmt: skip
        return done.returncode, done.stdout + done.stderr, time.monotonic() - started
    except subprocess.TimeoutExpired as hung:
        return -1, f"timed out after {timeout} s\n{hung.stdout or ''}", time.monotonic() - started


def build():
    # The test doubles too: the tests that catch the mutants run the NCCL path on the fake GPU.
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "2"), STREAMNCCL_BUILD_TESTING="1")
    return run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], 1800, env)


def first_failure(output):
    for line in output.splitlines():
        if line.startswith("FAILED ") or line.startswith("ERROR "):
            return line.split(" - ")[0]
    return output.strip().splitlines()[-1] if output.strip() else "?"


def tests(selection):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *selection],
               1800, env)  # fmt: skip


def mutate(mutant):
    """The mutated text of every file the mutant edits, and the originals."""
    edits = [(mutant.file, old, new) for old, new in mutant.edits] + list(mutant.more)
    originals, mutated = {}, {}
    for file, old, new in edits:
        text = mutated.get(file) or (ROOT / file).read_text()
        originals.setdefault(file, (ROOT / file).read_text())
        count = text.count(old)
        assert count == 1, f"{mutant.name}: expected the text once in {file}, found {count}"
        mutated[file] = text.replace(old, new)
    return originals, mutated


def audit(mutant):
    originals, mutated = mutate(mutant)
    for file, text in mutated.items():
        (ROOT / file).write_text(text)
    try:
        code, output, _ = build()
        if code != 0:
            return {"result": "build failed", "detail": output[-2000:]}
        code, output, seconds = tests(BEHAVIOUR)
        if code != 0:
            return {"result": "caught", "by": first_failure(output), "seconds": round(seconds)}
        code, output, seconds = tests(CALL_LOGS)
        if code != 0:
            return {"result": "caught by a call log only", "by": first_failure(output)}
        return {"result": "survived"}
    finally:
        for file, text in originals.items():
            (ROOT / file).write_text(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="names of the mutants to run")
    parser.add_argument("--json", help="where to write the results")
    parser.add_argument("--check", action="store_true", help="only check every mutant applies")
    parser.add_argument(
        "--changed-since", metavar="REV", help="only mutants of files changed since REV"
    )
    parser.add_argument("--list", action="store_true", help="print the chosen mutants' names only")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.changed_since:
        changed = set(
            subprocess.run(
                ["git", "diff", "--name-only", args.changed_since, "--", "csrc"],
                cwd=ROOT, capture_output=True, text=True, check=True,
            ).stdout.split()
        )  # fmt: skip
        chosen = [m for m in chosen if ({m.file} | {f for f, _, _ in m.more}) & changed]
    if args.list:
        print(" ".join(m.name for m in chosen))
        return 0
    if args.check:
        for mutant in chosen:
            mutate(mutant)
        print(f"{len(chosen)} mutants apply")
        return 0
    results = {}
    for mutant in chosen:
        result = audit(mutant)
        results[mutant.name] = dict(result, what=mutant.what, file=mutant.file)
        print(f"{mutant.name:36} {result['result']:28} {result.get('by', '')}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    code, output, _ = build()  # the unmutated extension again
    caught = sum(r["result"] == "caught" for r in results.values())
    print(f"{caught} of {len(results)} caught by a behaviour test")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
