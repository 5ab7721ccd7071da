"""The life of an op and of a group on the NCCL path, checked on the fake GPU: what a Work holds
and for how long (captured, failed, completed, waited for), what the watchdog does with the
faults it meets, how the group ends, and what the flight recorder says an op is doing.

Each test names the defect of issue 16 it catches; those whose failure on broken code is a
crash or a deadlock run in a child process with a hard timeout.
"""

import functools
import gc
import pickle
import tempfile
import threading
import time
from datetime import timedelta

import fakes
import pytest
import streamnccl
import torch
import torch.distributed as dist
from fakes import fake_group, fake_ranks, needs_nccl_path, opts, run_ranks, settle
from streamnccl import _testing
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, ReduceScatterOptions

pytestmark = needs_nccl_path
CPU = torch.device("cpu")


def run_child(scenario, timeout_s=fakes.CHILD_TIMEOUT_S):
    return fakes.run_child("test_nccl_lifecycle", scenario, timeout_s)


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _testing.FakeGpu.forget_thread_device()


def connected(**settings):
    pg, gpu = fake_group(**settings)
    pg.eager_connect_single_device(CPU)
    return pg, gpu


def held_group_with_dump(timeout_s):
    """A group that dumps its flight recorder to a fresh folder, on a GPU whose events are held
    (what is issued looks stuck): (pg, gpu, dump_dir)."""
    dump_dir = tempfile.mkdtemp()
    pg, gpu = connected(
        dump_dir=dump_dir, timeout=timedelta(seconds=timeout_s), trace_buffer_size=8
    )
    gpu.hold_events(True)
    return pg, gpu, dump_dir


# --- defect 1: teardown finishes the ops in flight, then finalizes the communicators


def test_destroy_waits_for_the_ops_in_flight_then_finalizes():
    pg, gpu = connected()
    gpu.hold_events(True)  # the GPU is busy: the op is still queued when the group goes
    x = torch.ones(4)
    pg.allreduce([x], opts(AllreduceOptions))
    destroyed = threading.Event()

    def destroy():
        nonlocal pg
        pg.shutdown()
        destroyed.set()

    thread = threading.Thread(target=destroy)
    thread.start()
    assert not destroyed.wait(0.3)  # it waits for the op
    gpu.hold_events(False)
    thread.join(10)
    assert destroyed.is_set()
    assert torch.equal(x, torch.full((4,), 3.0))  # the op ran: this rank and its 2 mirrors
    calls = gpu.calls()
    assert "ncclCommAbort(C0)" not in calls
    assert calls.index("ncclCommFinalize(C0)") < calls.index("ncclCommDestroy(C0)")
    assert settle(gpu) == []


@pytest.mark.slow
def test_a_teardown_past_the_timeout_aborts_and_names_the_op():
    # The op's own timeout is longer than the group's, so the teardown's deadline comes first.
    pg, gpu = connected(timeout=timedelta(seconds=1))
    gpu.hold_events(True)
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions, timeout=timedelta(seconds=60)))
    started = time.monotonic()
    pg.shutdown()
    assert 0.8 < time.monotonic() - started < 10
    with pytest.raises(
        dist.DistBackendError,
        match=r"allreduce #1 .*destroyed with 1 op\(s\) unfinished after the group's timeout of "
        r"1000 ms \(allreduce #1\): aborting its communicators",
    ):
        work.wait()
    assert "ncclCommAbort(C0)" in gpu.calls()
    assert "ncclCommDestroy(C0)" not in gpu.calls()
    gpu.hold_events(False)
    assert settle(gpu) == []


def test_a_communicator_a_graph_holds_is_left_alone_at_teardown():
    # NCCL finalizes, destroys or aborts a communicator only once every CUDA graph with work on
    # it is destroyed (FakeModels::teardown), which the group cannot know: at the end of a
    # program holding its graphs, waiting would never end. The group leaves it be.
    pg, gpu = connected()
    x = torch.ones(4)
    gpu.begin_capture("thread_local")
    pg.allreduce([x], opts(AllreduceOptions, False))
    assert gpu.end_capture() == "ok"
    gpu.replay(gpu.last_graph())
    started = time.monotonic()
    pg.shutdown()  # the graph is alive
    assert time.monotonic() - started < 5
    assert not [c for c in gpu.calls() if c.startswith(("ncclCommFinalize", "ncclCommDestroy",
                                                          "ncclCommAbort"))]  # fmt: skip
    assert settle(gpu) == []
    assert torch.equal(x, torch.full((4,), 3.0))  # the replay ran all the same
    gpu.destroy_graph(gpu.last_graph())


def test_aborting_a_communicator_a_graph_holds_stops_its_kernels_without_blocking():
    # A hung op must end even on a communicator a graph holds: ncclCommAbort stops the kernels
    # first, then waits for the graphs' destruction (FakeModels::teardown), so the group calls
    # it on a thread of its own.
    pg, gpu = connected()
    gpu.begin_capture("thread_local")
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions, False))
    assert gpu.end_capture() == "ok"
    started = time.monotonic()
    pg.abort()
    assert time.monotonic() - started < 2, "abort() waited for the graph"
    deadline = time.monotonic() + 10
    while "ncclCommAbort(C0)" not in gpu.calls():
        assert time.monotonic() < deadline, "the communicator was never aborted"
        time.sleep(0.01)
    gpu.destroy_graph(gpu.last_graph())  # the abort's own thread may now finish
    assert settle(gpu) == []


def _talk_both_ways(rank, pg, gpu):
    peer = 1 - rank
    inbox = torch.zeros(4)
    receiving = pg.recv([inbox], peer, 0)
    pg.send([torch.full((4,), float(rank))], peer, 0).wait(timedelta(seconds=10))
    receiving.wait(timedelta(seconds=10))
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions, False)).wait()
    return inbox


def test_ranks_finalize_their_communicators_together_at_teardown():
    # Each rank has the group's communicator and a lane each way, which the two ranks opened
    # in opposite orders. A node's ranks finalize a communicator together: every finalize
    # begins before any is waited for, or the two ranks would wait on different ones.
    groups = fakes.connect(fake_ranks(2, timeout=timedelta(seconds=20)))
    run_ranks(groups, _talk_both_ways)
    started = time.monotonic()
    fakes.shut_down(groups)
    assert time.monotonic() - started < 10
    for _, gpu in groups:
        calls = gpu.calls()
        assert not [c for c in calls if c.startswith("ncclCommAbort")], calls
        assert sum(c.startswith("ncclCommDestroy") for c in calls) == 3, calls


def test_abort_ends_a_finalize_waiting_for_a_peer_at_once():
    # Rank 0 finalizes; rank 1 never does, so the finalize waits for it. An abort meanwhile
    # (ProcessGroup.abort(), as torchft calls it) ends the finalize's polling and frees the
    # communicator once: not ten seconds later, not under the poll.
    (pg0, gpu0), (pg1, _) = groups = fakes.connect(fake_ranks(2, timeout=timedelta(seconds=20)))
    closing = threading.Thread(target=pg0.shutdown)
    closing.start()
    deadline = time.monotonic() + 10
    while not any(c.startswith("ncclCommFinalize") for c in gpu0.calls()):
        assert time.monotonic() < deadline, "rank 0 never began finalizing"
        time.sleep(0.01)
    started = time.monotonic()
    pg0.abort()
    closing.join(timeout=30)
    assert not closing.is_alive(), "shutdown() hung after abort()"
    assert time.monotonic() - started < 5, "the abort waited for the finalize's deadline"
    assert sum(c.startswith("ncclCommAbort(C0)") for c in gpu0.calls()) == 1, gpu0.calls()
    assert settle(gpu0) == []
    pg1.abort()
    fakes.shut_down(groups)


def test_abort_waits_for_a_call_in_progress_that_took_no_lock():
    # An op's use of a connected communicator takes no lock. Its ncclAllReduce returns
    # ncclInProgress, and the use polls the communicator until the call is done. An abort from
    # another thread meanwhile waits for that poll to see it and end before ncclCommAbort frees
    # the communicator: a poll after the free would be a use after free.
    pg, gpu = connected()
    gpu.in_progress_next("ncclAllReduce", 1_000_000)
    failures = []

    def sync_all_reduce():
        try:
            pg.allreduce([torch.ones(4)], opts(AllreduceOptions, False)).wait()
        except dist.DistBackendError as error:
            failures.append(str(error))

    issuing = threading.Thread(target=sync_all_reduce)
    issuing.start()
    deadline = time.monotonic() + 10
    while not any(c.startswith("ncclAllReduce") for c in gpu.calls()):
        assert time.monotonic() < deadline, "the all_reduce was never issued"
        time.sleep(0.01)
    pg.abort()
    issuing.join(timeout=30)
    assert not issuing.is_alive(), "the op's poll never ended after abort()"
    assert failures and "aborted while ncclAllReduce was in progress" in failures[0], failures
    assert sum(c.startswith("ncclCommAbort(C0)") for c in gpu.calls()) == 1, gpu.calls()
    assert settle(gpu) == []


# --- defect 2: reductions NCCL lacks are refused at the call


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_bitwise_reductions_are_refused_on_cuda_at_the_call(op, async_op):
    pg, gpu = connected()
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    with pytest.raises(
        TypeError, match=f"allreduce: NCCL has no bitwise reductions, so reduce op {op}"
    ):
        pg.allreduce([x], opts(AllreduceOptions, async_op, reduceOp=getattr(dist.ReduceOp, op)))
    with pytest.raises(TypeError, match="NCCL has no bitwise reductions"):
        pg._reduce_scatter_base(
            torch.zeros(1, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
            opts(ReduceScatterOptions, async_op, reduceOp=getattr(dist.ReduceOp, op)),
        )  # fmt: skip
    assert not [c for c in gpu.calls() if c.startswith(("ncclAllReduce", "ncclReduceScatter"))]
    pg.allreduce([x], opts(AllreduceOptions, async_op)).wait()  # the group goes on
    assert gpu.synchronize()
    assert x.tolist() == [3, 6, 9]
    assert settle(gpu) == []


# --- defect 3: nothing escapes the watchdog thread


WATCHDOG_MEETS_A_CUDA_ERROR = """
    import os, pickle, tempfile, time, torch
    from datetime import timedelta
    import torch.distributed as dist
    from torch._C._distributed_c10d import AllreduceOptions
    dump_dir = tempfile.mkdtemp()
    pg, gpu = t.connected(dump_dir=dump_dir, enable_timing={timing})
    gpu.hold_events(True)
    work = pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions))
    gpu.fail_cuda("{call}", "an illegal memory access was encountered "
                  "(cudaErrorIllegalAddress)", sticky={sticky})
    gpu.hold_events(False)
    deadline = time.monotonic() + 5
    while "streamnccl_trace_rank_0" not in os.listdir(dump_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("dumped:", sorted(os.listdir(dump_dir)))
    try:
        work.wait()
        print("op: completed")
    except dist.DistBackendError as error:
        print("op:", error)
    try:
        pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions))
    except dist.DistBackendError as error:
        print("later:", error)
    print("violations:", t.settle(gpu))
    print("alive")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "call, timing, sticky",
    [
        ("cudaEventQuery", False, True),
        ("cudaEventElapsedTime", True, False),
        ("cudaThreadExchangeStreamCaptureMode", False, False),
        ("cudaSetDevice", False, True),
    ],
)
def test_a_cuda_error_in_the_watchdog_breaks_the_group_with_evidence(call, timing, sticky):
    output = run_child(WATCHDOG_MEETS_A_CUDA_ERROR.format(call=call, timing=timing, sticky=sticky))
    assert "alive" in output
    assert "dumped: ['streamnccl_trace_rank_0']" in output
    assert "illegal memory access" in output.split("later:")[1]
    assert "unusable since an earlier failure" in output.split("later:")[1]
    assert "violations: []" in output


A_FAILURE_SHOWS_ONCE_DUMPED = """
    import os, threading, time, torch
    from datetime import timedelta
    import torch.distributed as dist
    from blocked_dump import BlockedDump
    from torch._C._distributed_c10d import AllreduceOptions
    pg, gpu, dump_dir = t.held_group_with_dump(timeout_s=1)
    work = pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions))
    seen = []
    def wait_then_look():  # a caller polling for the failure
        try:
            work.wait(timedelta(seconds=30))
            seen.append("completed")
        except dist.DistBackendError as error:
            seen.append((os.path.exists(blocked.written), str(error)))
    with BlockedDump(dump_dir, 0) as blocked:
        {fault}
        blocked.wait_for_writer(timeout_s=30)
        print("failed while dumping:", not work.is_success())
        asked = time.monotonic()
        print("completed while dumping:", work.is_completed())
        print("is_completed waited for the dump:", time.monotonic() - asked > 10)  # it holds 30 s
        waiter = threading.Thread(target=wait_then_look)
        waiter.start()
        waiter.join(timeout=2)  # returns at once where the wait does not wait for the dump
        last = blocked.read()["entries"][-1]
    waiter.join(timeout=30)
    print("dumped:", last["profiling_name"], "error" in last)
    print("dump there when the wait raised:", seen[0][0])
    print("op:", seen[0][1])
    gpu.hold_events(False)
    pg.abort()
    print("alive")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, error",
    [
        ("", "timed out after 1000 ms (streamnccl watchdog)"),
        ('gpu.fail_cuda("cudaEventQuery", "an illegal memory access", sticky=True)',
         "an illegal memory access"),
    ],
    ids=["timeout", "device-error"],
)  # fmt: skip
def test_an_op_fails_only_once_its_dump_is_written(fault, error):
    # Whoever learns of a failure, the watchdog or a caller looking at the op's end, it is
    # raised only once the dump is there to read.
    output = run_child(A_FAILURE_SHOWS_ONCE_DUMPED.format(fault=fault))
    assert "failed while dumping: False" in output, output
    assert "completed while dumping: False" in output, output
    assert "is_completed waited for the dump: False" in output, output
    assert "dumped: nccl:all_reduce True" in output, output
    assert "dump there when the wait raised: True" in output, output
    assert error in output.split("op:")[1], output
    assert "alive" in output


A_DUMP_THAT_NEVER_ENDS = """
    import torch
    from datetime import timedelta
    import torch.distributed as dist
    from blocked_dump import BlockedDump
    from torch._C._distributed_c10d import AllreduceOptions
    pg, gpu, dump_dir = t.held_group_with_dump(timeout_s=1)
    work = pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions))
    with BlockedDump(dump_dir, 0) as blocked:  # never read: the writer never finishes
        blocked.wait_for_writer(timeout_s=30)
        try:
            work.wait(timedelta(seconds=120))
            print("op: completed")
        except dist.DistBackendError as error:
            print("op:", error)
    gpu.hold_events(False)
    pg.abort()
    print("alive")
"""


@pytest.mark.slow
def test_a_dump_that_never_ends_delays_the_failure_but_does_not_stop_it():
    # The ops fail once the dump is written, or once the writer has had 30 s: a hung file
    # system must not turn a timeout into a hang.
    output = run_child(A_DUMP_THAT_NEVER_ENDS, timeout_s=120)
    assert "timed out after 1000 ms (streamnccl watchdog)" in output.split("op:")[1], output
    assert "alive" in output


A_TEARDOWN_DURING_A_BREAK = """
    import gc, threading, torch
    from datetime import timedelta
    import torch.distributed as dist
    from blocked_dump import BlockedDump
    from torch._C._distributed_c10d import AllreduceOptions
    pg, gpu, dump_dir = t.held_group_with_dump(timeout_s=20)
    first = pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions))
    second = pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions))
    # Its Work dropped, only the group holds its tensor. Not contiguous: a copy-back follows its
    # NCCL kernel, and still runs after the abort.
    pg.allreduce([torch.ones(6, 2).t()], t.opts(AllreduceOptions))
    errors = []
    def expire():  # breaks the group on this thread, and is held in its dump
        try:
            first.wait(timedelta(milliseconds=200))
        except dist.DistBackendError as error:
            errors.append(str(error))
    with BlockedDump(dump_dir, 0) as blocked:
        breaker = threading.Thread(target=expire)
        breaker.start()
        blocked.wait_for_writer(timeout_s=30)
        closer = threading.Thread(target=pg.shutdown)  # the group ends meanwhile
        closer.start()
        closer.join(timeout=60)
        print("closed:", not closer.is_alive())
        blocked.read()
    breaker.join(timeout=30)
    print("first:", errors)
    try:
        second.wait()
        print("second: completed")
    except dist.DistBackendError as error:
        print("second:", error)
    gc.collect()
    for _ in range(10):  # the allocator's next blocks of its size, written on the caller's stream
        gpu.write(torch.empty(6, 2), 7.0)
    gpu.hold_events(False)  # the copy-back runs now: its memory must still be its own
    print("violations:", t.settle(gpu))
"""


@pytest.mark.slow
def test_a_teardown_during_a_break_on_another_thread_frees_nothing_in_use():
    # The thread breaking the group has not yet taken the ops in flight while it writes the
    # dump: the teardown fails them itself and keeps their tensors until their end has passed.
    output = run_child(A_TEARDOWN_DURING_A_BREAK, timeout_s=120)
    assert "closed: True" in output, output
    assert "not completed within the timeout of 200 ms" in output.split("first:")[1], output
    assert "destroyed while it broke" in output.split("second:")[1], output
    assert "violations: []" in output, output


# --- defect 4: a captured op holds what its replays use until wait()


def test_a_captured_op_holds_its_factor_until_wait():
    # The PREMUL_SUM factor is converted on the caller's stream, from the graph's pool, and
    # read by the NCCL kernel on the internal stream. Freed before wait() joins the two, the
    # caller's next allocation in the capture gets it, and its kernel overwrites it at replay
    # before the NCCL kernel reads it.
    pg, gpu = connected()
    x = torch.ones(4)
    factor = torch.tensor(3.0, dtype=torch.float64)  # converted to float32: a copy
    gpu.begin_capture("thread_local")
    work = pg.allreduce([x], opts(AllreduceOptions, reduceOp=dist._make_nccl_premul_sum(factor)))
    reused = torch.empty((), dtype=torch.float32)  # the converted factor's size, on S0
    gpu.write(reused, 100.0)
    work.wait()
    assert gpu.end_capture() == "ok"
    gpu.replay(gpu.last_graph())
    assert settle(gpu) == []
    assert torch.equal(x, torch.full((4,), 9.0))  # 3 ranks, each 1.0 * 3.0


def test_a_captured_barrier_holds_its_token_until_wait():
    pg, gpu = connected()
    gpu.begin_capture("thread_local")
    work = pg.barrier()
    reused = torch.empty(1)
    gpu.write(reused, 5.0)
    work.wait()
    assert gpu.end_capture() == "ok"
    gpu.replay(gpu.last_graph())
    assert settle(gpu) == []


# --- defect 5: a failed op's tensors are let go only once its end has passed


def test_a_failed_ops_tensors_outlive_its_kernels_after_the_abort():
    pg, gpu = connected()
    gpu.hold_events(True)
    x = torch.ones(6, 2).t()  # not contiguous: a copy-back follows the NCCL kernel
    pg.allreduce([x], opts(AllreduceOptions))
    del x
    gc.collect()  # only the group holds x now
    pg.abort()  # the NCCL kernel is stopped; the copy-back on the stream is not
    pg._stats()  # a call on the group lets go of what has ended
    for _ in range(10):  # the allocator's next blocks of x's size, written on the caller's stream
        gpu.write(torch.empty(6, 2), 7.0)
    gpu.hold_events(False)
    assert settle(gpu) == []


@pytest.mark.slow
def test_a_teardown_that_aborts_gives_failed_ops_time_to_pass_their_end():
    # The flush runs past the timeout, so the teardown aborts; the op's end passes just after
    # the abort. Its tensors are let go then, not kept for good because the flush's deadline
    # had already passed.
    pg, gpu = fake_group(timeout=timedelta(seconds=3))
    pg.eager_connect_single_device(CPU)
    gpu.hold_events(True)
    x = torch.ones(1000)
    address = x.data_ptr()
    pg.allgather([[torch.zeros(1000) for _ in range(3)]], [x], opts(AllgatherOptions))
    del x
    gc.collect()  # only the group holds the input now

    def let_the_end_pass_after_the_abort():
        deadline = time.monotonic() + 30
        while "ncclCommAbort(C0)" not in gpu.calls() and time.monotonic() < deadline:
            time.sleep(0.005)
        # Later than the teardown's next step after the abort, well within the grace it gives
        # (the timeout, 3 s). The pause only decides whether a teardown giving no grace is
        # seen; a correct one passes whatever it is.
        time.sleep(0.5)
        gpu.hold_events(False)

    releaser = threading.Thread(target=let_the_end_pass_after_the_abort)
    releaser.start()
    pg.shutdown()
    releaser.join()
    assert "ncclCommAbort(C0)" in gpu.calls()
    assert not _testing.FakeGpu.memory_live(address), "the failed op's input was kept for good"
    assert settle(gpu) == []


# --- defect 6: a Work holds its tensors until the op completes, or wait(), and no longer


def test_a_completed_ops_input_is_let_go_though_its_work_is_kept():
    # all_gather: the Work keeps its outputs (its result), not its input, which nothing else
    # holds here.
    pg, gpu = connected()
    x = torch.ones(1000)
    address = x.data_ptr()
    outputs = [torch.zeros(1000) for _ in range(3)]
    works = [pg.allgather([outputs], [x], opts(AllgatherOptions))]  # kept, never waited for
    del x
    assert gpu.synchronize()  # the op has run; nobody has looked
    time.sleep(0.2)  # the watchdog (every 50 ms) sees it completed
    pg._stats()  # the next call on the group lets go of it
    assert not _testing.FakeGpu.memory_live(address)
    assert works[0].is_completed()


def test_wait_lets_go_only_once_the_op_has_run():
    # all_gather: the Work's outputs are not its input, which nothing else holds.
    pg, gpu = connected()
    gpu.hold_events(True)
    x = torch.arange(8, dtype=torch.float32)
    outputs = [torch.zeros(8) for _ in range(3)]
    work = pg.allgather([outputs], [x], opts(AllgatherOptions))
    del x
    work.wait()  # joins the caller's stream; the op has not run
    for _ in range(10):  # the allocator's next blocks of x's size, written on the caller's stream
        gpu.write(torch.empty(8), -1.0)
    gpu.hold_events(False)
    assert settle(gpu) == []
    for output in outputs:
        assert torch.equal(output, torch.arange(8, dtype=torch.float32))


# --- defect 7: the watchdog drops no last reference and fails no op under its lock


WATCHDOG_FAILS_OPS_WITH_CALLBACKS = """
    import gc, time, torch, streamnccl
    from datetime import timedelta
    import torch.distributed as dist
    from streamnccl import _testing
    from torch._C._distributed_c10d import AllreduceOptions
    pg, gpu = t.connected(timeout=timedelta(milliseconds=200))
    gpu.hold_events(True)
    seen = []
    for _ in range(50):
        x = torch.ones(100)
        fut = pg.allreduce([x], t.opts(AllreduceOptions)).get_future()
        # A comm hook that asks for the group's stats: it runs when the op fails.
        fut.then(lambda f: seen.append(len(pg._stats())))
        del x, fut
    gc.collect()
    deadline = time.monotonic() + 10
    while len(seen) < 50 and time.monotonic() < deadline:
        pg._stats()  # the caller's thread lets go of what ended, beside the watchdog
        time.sleep(0.01)
    gpu.hold_events(False)
    print("callbacks:", len(seen))
    del pg
    gc.collect()
    print("freed by the watchdog:", _testing.FakeGpu.frees_by_thread().get("streamnccl-wdog", 0))
"""


def test_the_watchdog_fails_ops_without_its_lock_and_frees_nothing():
    output = run_child(WATCHDOG_FAILS_OPS_WITH_CALLBACKS)
    assert "callbacks: 50" in output
    assert "freed by the watchdog: 0" in output


# --- defect 8: the flight recorder says started when the device starts the op


def _states(group_name):
    dump = pickle.loads(streamnccl.dump_flight_recorder())
    return [e["state"] for e in dump["entries"] if e["process_group"][0] == group_name]


def test_an_op_is_scheduled_until_it_runs_without_timing():
    pg, gpu = connected(trace_buffer_size=100)
    gpu.hold_events(True)
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    name = pickle.loads(streamnccl.dump_flight_recorder())["entries"][-1]["process_group"][0]
    assert _states(name)[-1] == "scheduled"  # issued, not started: the GPU is busy
    gpu.hold_events(False)
    assert gpu.synchronize()
    assert _states(name)[-1] == "completed"


def test_a_timed_op_is_started_once_its_start_event_has_passed():
    # Rank 1 is late: rank 0's op has started on its stream but cannot complete.
    groups = fakes.connect(fake_ranks(2, enable_timing=True, trace_buffer_size=100))
    (pg0, gpu0), (pg1, gpu1) = groups
    pg0.allreduce([torch.ones(4)], opts(AllreduceOptions, False))
    name = pickle.loads(streamnccl.dump_flight_recorder())["entries"][-1]["process_group"][0]
    assert _states(name)[-1] == "started"
    pg1.allreduce([torch.ones(4)], opts(AllreduceOptions, False))
    assert gpu0.synchronize() and gpu1.synchronize()
    fakes.shut_down(groups)


# --- defect 10: one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) and the lanes


def _swap(rank, pg, gpu):
    """Both ranks isend, then irecv, the same peer: each send needs the peer's recv to run
    while its own is still queued, as with a large message."""
    peer = 1 - rank
    inbox = torch.zeros(1000)
    sending = pg.send([torch.full((1000,), float(rank + 1))], peer, 0)
    receiving = pg.recv([inbox], peer, 0)
    try:
        receiving.wait(timedelta(seconds=20))  # blocks the host: fails once the op does
        sending.wait(timedelta(seconds=20))
    except dist.DistBackendError as error:
        return str(error)
    return inbox


def test_an_isend_irecv_swap_runs_with_a_queue_per_stream():
    groups = fake_ranks(2)
    inboxes = run_ranks(groups, _swap)
    for rank, inbox in enumerate(inboxes):
        assert torch.equal(inbox, torch.full((1000,), float(2 - rank)))
    fakes.shut_down(groups)


def _ordered_first_contact(rank, pg, gpu):
    """Rank 0 sends then receives; rank 1 receives then sends: in program order that never
    waits in a circle, whatever the hardware queues."""
    peer = 1 - rank
    inbox = torch.zeros(16)
    mine = torch.full((16,), float(rank + 1))
    works = (
        [pg.send([mine], peer, 0), pg.recv([inbox], peer, 0)]
        if rank == 0
        else [pg.recv([inbox], peer, 0), pg.send([mine], peer, 0)]
    )
    for work in works:
        work.wait(timedelta(seconds=20))
    return inbox


def _first_contact_then_collective(rank, pg, gpu, rank_one_goes_on_late=False):
    """Both ranks post a message (rank 0 sends, rank 1 receives), then an all_reduce: in
    program order that never waits in a circle, whatever the hardware queues.

    With `rank_one_goes_on_late`, rank 1 goes on only once its recv has reached its queue.
    Were rank 0's send held back until its lane connected, it would reach the one queue behind
    the all_reduce, while rank 1's all_reduce sits behind its recv, which needs that send."""
    box = torch.full((16,), 5.0) if rank == 0 else torch.zeros(16)
    message = pg.send([box], 1, 0) if rank == 0 else pg.recv([box], 0, 0)
    if rank == 1 and rank_one_goes_on_late:
        deadline = time.monotonic() + 10
        while not any(call.startswith("ncclRecv(") for call in gpu.calls()):
            assert time.monotonic() < deadline, "the recv was never issued"
            time.sleep(0.005)
    x = torch.ones(4)
    pg.allreduce([x], opts(AllreduceOptions, False)).wait()
    message.wait(timedelta(seconds=20))
    assert gpu.synchronize()
    return box[0].item(), x[0].item()


def test_with_one_hardware_queue_a_first_contact_keeps_its_place_before_a_collective():
    # Both ranks go on to the all_reduce at once, so their first lane ops reach the one queue
    # at the same place; test_..._first_contact_waits_for_its_lanes_at_the_call has one rank
    # go on later, which only the wait at the call keeps out of a circle.
    world = fakes.fake_world(single_queue=True)
    groups = fakes.connect(fake_ranks(2, world=world, single_hardware_queue=True))
    assert run_ranks(groups, _first_contact_then_collective) == [(5.0, 2.0), (5.0, 2.0)]
    fakes.shut_down(groups)


def test_with_one_hardware_queue_a_first_contact_waits_for_its_lanes_at_the_call():
    world = fakes.fake_world(single_queue=True)
    groups = fakes.connect(
        fake_ranks(2, world=world, timeout=timedelta(seconds=5), single_hardware_queue=True)
    )
    program = functools.partial(_first_contact_then_collective, rank_one_goes_on_late=True)
    assert run_ranks(groups, program) == [(5.0, 2.0), (5.0, 2.0)]
    fakes.shut_down(groups)


def test_with_one_hardware_queue_a_pairs_first_ops_keep_program_order():
    # The two lanes to a peer connect on threads of their own; their first ops must reach the
    # one hardware queue in program order, not in the order the lanes connected.
    world = fakes.fake_world(single_queue=True)
    for _ in range(5):
        groups = fake_ranks(2, world=world, single_hardware_queue=True)
        inboxes = run_ranks(groups, _ordered_first_contact)
        assert [inbox[0].item() for inbox in inboxes] == [2.0, 1.0]
        fakes.shut_down(groups)


def test_with_one_hardware_queue_a_swap_times_out_naming_the_lanes():
    world = fakes.fake_world(single_queue=True)
    groups = fake_ranks(2, world=world, timeout=timedelta(seconds=1), single_hardware_queue=True)
    errors = run_ranks(groups, _swap)
    for error in errors:
        assert "timed out after 1000 ms (streamnccl watchdog) on the lane " in error, error
        assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in error and "batch_isend_irecv" in error, error
    for pg, _ in groups:
        pg.abort()


# --- the Work's other joins: synchronize(), the future's devices, wait() inside a capture


def test_synchronize_makes_the_callers_stream_wait_for_the_op():
    pg, gpu = connected()
    gpu.hold_events(True)
    x = torch.ones(4)
    work = pg.allreduce([x], opts(AllreduceOptions))
    work.synchronize()  # the caller's stream waits for the op; the host goes on
    read = gpu.read(x)  # the caller's next kernel
    gpu.hold_events(False)
    assert torch.equal(read.value(), torch.full((4,), 3.0))
    assert settle(gpu) == []


def test_every_future_names_the_ops_device():
    # A c10 future completed on a CUDA stream records events there, and then() callbacks wait
    # for them, only when it names the device. The fake's tensors are CPU tensors, whose
    # futures cannot name one: the fake notes the requests instead.
    pg, gpu = connected()
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions)).get_future().wait()
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions, False)).get_future().wait()
    pg._start_coalescing()
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    pg._end_coalescing().get_future().wait()
    assert len(gpu.future_streams()) == 3


def test_a_future_asked_for_after_the_op_was_issued_follows_the_ops_end():
    # On CUDA an op's task runs at issue, so a future asked for afterwards (DDP's comm hook
    # asks at once) is made once the op has settled. c10 records its events on the stream that
    # is current as it completes, and then() callbacks wait for them. So it must be completed
    # on a stream that waits for the op's end event: not on the op's stream, which has run
    # later ops since (or may be captured by now), nor on the caller's, which an async op does
    # not follow.
    pg, gpu = connected()
    x, y = torch.ones(4), torch.ones(4)
    for async_op in (True, False):
        gpu.clear()
        first = pg.allreduce([x], opts(AllreduceOptions, async_op))
        pg.allreduce([y], opts(AllreduceOptions, async_op))  # the op's stream runs more since
        future = first.get_future()
        calls = gpu.calls()
        issued = next(i for i, call in enumerate(calls) if call.startswith("ncclAllReduce"))
        op_stream = calls[issued].rsplit(", ", 1)[1].rstrip(")")
        end = next(
            call.split("(")[1].split(",")[0]
            for call in calls[issued:]
            if call.startswith("cudaEventRecord(") and call.endswith(f", {op_stream})")
        )
        future_stream = f"S{gpu.future_streams()[-1]}"
        assert future_stream not in (op_stream, "S0"), (async_op, calls)
        assert f"cudaStreamWaitEvent({future_stream}, {end})" in calls, (async_op, calls)
        assert settle(gpu) == []
        assert future.wait()[0] is x
        # Asked again, the same future: nothing more is made.
        first.get_future()
        assert len(gpu.future_streams()) == (1 if async_op else 2)


def test_a_future_asked_for_after_its_op_failed_reports_the_failure():
    # The op's task fails at issue (on CUDA the task runs then); the future, made only at the
    # ask, must carry that failure, not the outputs.
    pg, gpu = connected()
    gpu.fail_next("ncclAllReduce")
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    with pytest.raises(dist.DistBackendError, match=r"allreduce #1 \(\[4\], Float\)"):
        work.get_future().wait()


def test_wait_inside_a_capture_on_an_op_from_before_it_is_refused_clearly():
    pg, gpu = connected()
    gpu.hold_events(True)
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    gpu.begin_capture("global")
    with pytest.raises(ValueError, match="launched before the capture began.*wait\\(\\) for it"):
        work.wait()
    assert gpu.end_capture() == "ok"  # nothing was queried on the capturing thread
    gpu.hold_events(False)
    work.wait()
    assert settle(gpu) == []


def test_a_coalesced_group_never_launched_fails_the_works_its_ops_handed_out():
    # Each op recorded into a coalesced group hands out a Work on the group's future. A group
    # refused at its end (the group broke meanwhile), or left open at shutdown, is never
    # launched: its future must fail, or a wait() on those Works waits for ever.
    for end in ("aborted", "shut down"):
        pg, gpu = connected()
        pg._start_coalescing()
        work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
        if end == "aborted":
            pg.abort()
            with pytest.raises(dist.DistBackendError, match="aborted"):
                pg._end_coalescing()
        else:
            pg.shutdown()
        assert work.get_future().done(), end
        with pytest.raises(dist.DistBackendError, match="never launched|aborted"):
            work.get_future().wait()
