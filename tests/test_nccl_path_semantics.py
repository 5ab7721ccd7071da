"""The NCCL path checked for what makes GPU bugs, without a GPU.

Groups built on the fakes of NCCL and CUDA (csrc/fake/) run the real core and NCCL path on CPU
tensors on a fake GPU that checks what a real one would enforce or silently break on: memory
handed to NCCL still held when its kernel runs (against a caching allocator that reuses freed
memory at once), each call on the right device and stream, stream capture, communicator init
that waits for every rank, non-blocking NCCL calls. Each test names the defect or mutation of
the production code it catches. Scenarios whose failure on broken code is a deadlock or a
std::terminate run in a child process with a hard timeout.
"""

import gc
import textwrap
import threading
import time
from datetime import timedelta

import fakes
import pytest
import torch
import torch.distributed as dist
from collective_helpers import call_keeping_the_gil_until_it_blocks
from fakes import CHILD_TIMEOUT_S, fake_group, needs_nccl_path, opts, settle
from streamnccl import _testing
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    BroadcastOptions,
    ReduceOptions,
    ReduceScatterOptions,
)

pytestmark = needs_nccl_path


def run_child(scenario, timeout_s=CHILD_TIMEOUT_S):
    return fakes.run_child("test_nccl_path_semantics", scenario, timeout_s)


@pytest.fixture(autouse=True)
def fresh_thread_state():
    """Tests set the main thread's current device and stream on their fake GPU; undo that."""
    yield
    gc.collect()
    _testing.FakeGpu.forget_thread_device()


# --- D3: temporaries an NCCL group reads at ncclGroupEnd


def test_temporaries_of_grouped_calls_are_held_until_group_end():
    pg, gpu = fake_group()
    gpu.set_device(0)
    # Non-contiguous inputs: each op computes in a contiguous copy, which NCCL reads only at
    # ncclGroupEnd. The fake allocator hands a freed copy to the next op's copy at once.
    inputs = [torch.ones(6, 2).t() for _ in range(2)]
    pg._start_coalescing()
    for x in inputs:
        pg._allgather_base(torch.empty(3 * 12), x, opts(AllgatherOptions))
        pg._reduce_scatter_base(torch.empty(4), torch.ones(4, 3).t(), opts(ReduceScatterOptions))
    pg._end_coalescing().wait()
    # The list forms: allgather of a non-contiguous input, reduce_scatter of a list.
    pg.allgather_coalesced(
        [[torch.empty(2, 6) for _ in range(2)] for _ in range(3)], inputs, opts(AllgatherOptions)
    ).wait()
    pg._start_coalescing()
    pg.reduce_scatter(
        [torch.empty(5)], [[torch.ones(5) for _ in range(3)]], opts(ReduceScatterOptions)
    )
    pg.reduce_scatter(
        [torch.empty(5)], [[torch.ones(5) for _ in range(3)]], opts(ReduceScatterOptions)
    )
    pg._end_coalescing().wait()
    assert settle(gpu) == []


def test_a_failing_call_inside_a_group_still_ends_the_group():
    # NCCL's group is the calling thread's: one left open would swallow the thread's next
    # calls into it, never to be issued.
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.fail_next("ncclAllReduce")
    with pytest.raises(dist.DistBackendError, match="injected failure of ncclAllReduce"):
        work = pg.allreduce_coalesced(
            [torch.ones(2), torch.ones(3)], opts(AllreduceCoalescedOptions)
        )
        work.wait()
    assert _testing.FakeGpu.nccl_group_depth() == 0
    calls = gpu.calls()
    assert calls.index("ncclGroupEnd()") < calls.index("ncclCommAbort(C0)")
    assert settle(gpu) == []


# --- D4 and M3: what an async op's kernel reads on the internal stream stays held


def test_a_dropped_input_is_held_until_the_op_has_run():
    # M3: the Work keeps the tensors of an async op until its end event has passed; without
    # that, the caller's tensor goes back to the allocator while NCCL still reads it.
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)
    pg.allreduce([torch.ones(1000)], opts(AllreduceOptions))  # Work and tensor dropped
    pg.allgather([[torch.empty(7) for _ in range(3)]], [torch.ones(7)], opts(AllgatherOptions))
    gc.collect()
    for _ in range(20):
        torch.ones(1000) + 1  # the allocator's next blocks of those sizes
        torch.ones(7) * 2
    gpu.hold_events(False)
    assert settle(gpu) == []


def test_a_device_premul_sum_factor_is_held_until_the_reduction_has_run():
    # D4: the factor is converted to the tensor's dtype on the caller's stream and read by the
    # kernel on the internal stream; the converted copy must outlive the kernel.
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)
    factor = torch.tensor(2.0, dtype=torch.float64)  # not the tensor's dtype: a copy is made
    op = dist._make_nccl_premul_sum(factor)
    pg.allreduce([torch.ones(8)], opts(AllreduceOptions, reduceOp=op))
    del factor, op
    gc.collect()
    for _ in range(10):
        torch.tensor(3.0)
    gpu.hold_events(False)
    assert settle(gpu) == []
    assert any(c.startswith("ncclRedOpCreatePreMulSum(scalar=device") for c in gpu.calls())


# --- D6 and M8: every call on the group's device and the op's stream


def test_no_thread_makes_a_context_on_another_device():
    # D6: a rank on cuda:1 whose watchdog queried events on a thread with no device made a
    # context on cuda:0. The caller's thread here has cuda:0 current, as a rank that never
    # called torch.cuda.set_device would: the path must set the group's device itself.
    pg, gpu = fake_group(device_index=1)
    gpu.set_device(0)
    x = torch.ones(4)
    pg.allreduce([x], opts(AllreduceOptions)).wait()
    pg.allreduce([x], opts(AllreduceOptions, False)).wait()
    pg.send([x], 1, 0).wait()
    violations = settle(gpu)
    assert violations == []
    assert gpu.contexts() == {0, 1}  # 0 by the caller's own choice above
    del pg
    pg, gpu = fake_group(device_index=1)
    gpu.set_device(1)
    pg.allreduce([x], opts(AllreduceOptions)).wait()
    assert settle(gpu) == []
    assert gpu.contexts() == {1}


def test_each_nccl_call_is_made_with_its_stream_current():
    # M8: the ATen work of an op (contiguous copies, AVG's division) runs on the current
    # stream, so the op's stream must be current while the NCCL call is made.
    pg, gpu = fake_group()
    x = torch.ones(6, 2).t()
    pg.allreduce([x], opts(AllreduceOptions, reduceOp=dist.ReduceOp.AVG)).wait()
    pg.allreduce([x], opts(AllreduceOptions, False)).wait()
    pg.send([x], 1, 0).wait()
    assert settle(gpu) == []


# --- M4: wait() joins the stream current at wait(), not at launch


def test_wait_makes_the_current_stream_wait():
    pg, gpu = fake_group()
    x = torch.ones(4)
    work = pg.allreduce([x], opts(AllreduceOptions))
    previous = gpu.use_stream(7)  # the caller moves to another stream before waiting
    try:
        gpu.clear()
        work.wait()
        assert gpu.calls() == ["cudaStreamWaitEvent(S7, E2)"]
    finally:
        gpu.use_stream(previous)


def test_block_current_stream_makes_the_current_stream_wait():
    # c10d's default would launch a kernel released by the op's future, which streamnccl
    # completes at issue: the stream would wait for nothing.
    pg, gpu = fake_group()
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    previous = gpu.use_stream(7)
    try:
        gpu.clear()
        work.block_current_stream()
        assert gpu.calls() == ["cudaStreamWaitEvent(S7, E2)"]
    finally:
        gpu.use_stream(previous)


# --- M7: NCCL reads and writes the caller's tensors


def test_nccl_reads_the_inputs_and_writes_the_outputs():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    x, out, part = torch.ones(4), torch.empty(12), torch.empty(4)

    def buffers(call):
        gpu.clear()
        call().wait()
        return [(name, send, recv) for name, send, recv, _ in gpu.buffers()]

    p = torch.Tensor.data_ptr
    assert buffers(lambda: pg._allgather_base(out, x, opts(AllgatherOptions))) == [
        ("ncclAllGather", p(x), p(out))
    ]
    assert buffers(lambda: pg._reduce_scatter_base(part, out, opts(ReduceScatterOptions))) == [
        ("ncclReduceScatter", p(out), p(part))
    ]
    assert buffers(lambda: pg.allreduce([x], opts(AllreduceOptions))) == [
        ("ncclAllReduce", p(x), p(x))
    ]
    assert buffers(lambda: pg.broadcast([x], opts(BroadcastOptions, rootRank=2))) == [
        ("ncclBroadcast", p(x), p(x))
    ]
    assert buffers(lambda: pg.reduce([x], opts(ReduceOptions, rootRank=0))) == [
        ("ncclReduce", p(x), p(x))
    ]
    assert buffers(lambda: pg.send([x], 1, 0)) == [("ncclSend", p(x), 0)]
    assert buffers(lambda: pg.recv([part], 1, 0)) == [("ncclRecv", 0, p(part))]


# --- M9: blocking_wait blocks the host


def test_blocking_wait_blocks_until_the_timeout():
    pg, gpu = fake_group(timeout=timedelta(milliseconds=300), blocking_wait=True)
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    started = time.monotonic()
    # Whichever sees the deadline first: wait(), or the watchdog (then wait() reports that).
    with pytest.raises(
        dist.DistBackendError,
        match="not completed within the timeout of 300 ms|timed out after 300 ms",
    ):
        work.wait()
    assert 0.25 < time.monotonic() - started < 5


@pytest.mark.slow
def test_without_blocking_wait_wait_returns_at_once():
    pg, gpu = fake_group(timeout=timedelta(seconds=5))
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    started = time.monotonic()
    work.wait()
    assert time.monotonic() - started < 1
    pg.abort()


def _wait_while_another_thread_releases_the_gpu(gpu, wait):
    """Calls wait() while the GPU's events are held; a second Python thread lets them pass only
    once wait() has let the GIL go (until then this thread keeps it: a switch interval of
    1000 s). A wait() that kept the GIL while it blocks would wait out its whole timeout."""
    about_to_wait = threading.Event()

    def let_the_gpu_go():
        about_to_wait.wait()
        gpu.hold_events(False)

    helper = threading.Thread(target=let_the_gpu_go)
    helper.start()
    try:
        return call_keeping_the_gil_until_it_blocks(wait, about_to_wait)
    finally:
        helper.join()


@pytest.mark.parametrize("how", ["with a timeout", "blocking_wait"])
def test_a_sync_ops_wait_that_may_block_lets_the_gil_go(how):
    # A sync op's plain wait() returns at once and keeps the GIL; one that may block on the
    # op's end must let it go, as c10d's wait() does.
    pg, gpu = fake_group(timeout=timedelta(seconds=10), blocking_wait=how == "blocking_wait")
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)
    x = torch.ones(4)
    work = pg.allreduce([x], opts(AllreduceOptions, async_op=False))
    timeout = timedelta(seconds=5) if how == "with a timeout" else None
    ended = _wait_while_another_thread_releases_the_gpu(
        gpu, lambda: work.wait(timeout) if timeout else work.wait()
    )
    assert ended
    assert gpu.synchronize()
    assert torch.equal(x, torch.full((4,), 3.0))  # this rank and its two mirrors
    assert settle(gpu) == []


# --- D2: every failure aborts the communicators


def test_a_failed_op_aborts_the_communicator():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.fail_next("ncclAllReduce")
    with pytest.raises(dist.DistBackendError, match="injected failure of ncclAllReduce"):
        pg.allreduce([torch.ones(4)], opts(AllreduceOptions, False))
    assert "ncclCommAbort(C0)" in gpu.calls()
    assert settle(gpu) == []


def test_a_failed_connection_aborts_the_communicators_already_open():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))  # C0
    # The lanes to rank 1 connect in the background, each on a thread of its own: both fail,
    # so that the send's own lane is sure to (which one inits first is up to the threads).
    gpu.fail_next("ncclCommInitRank")
    gpu.fail_next("ncclCommInitRank")
    with pytest.raises(dist.DistBackendError, match=r"send #1 .* ncclCommInitRank failed"):
        pg.send([torch.ones(4)], 1, 0).wait()
    assert "ncclCommAbort(C0)" in gpu.calls()
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
        pg.allreduce([torch.ones(4)], opts(AllreduceOptions, False))
    assert settle(gpu) == []


def test_abort_stops_the_kernels_before_their_tensors_are_let_go():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)
    for _ in range(3):  # Works and tensors dropped: only the group holds them now
        pg.allreduce([torch.ones(100)], opts(AllreduceOptions))
    kept = pg.allreduce([torch.ones(100)], opts(AllreduceOptions))
    gc.collect()
    pg.abort()
    with pytest.raises(dist.DistBackendError, match="aborted"):
        kept.wait()
    gpu.hold_events(False)  # the aborted kernels exit; what follows them on the stream runs
    assert settle(gpu) == []


# --- D7: dtypes NCCL cannot reduce are refused at the call


@pytest.mark.parametrize(
    "dtype",
    [torch.int16, torch.uint16, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu],
)
def test_a_dtype_nccl_cannot_reduce_is_a_type_error_and_the_group_goes_on(dtype):
    pg, gpu = fake_group()
    x = torch.zeros(4).to(dtype)
    with pytest.raises(TypeError, match="allreduce: NCCL cannot reduce dtype"):
        pg.allreduce([x], opts(AllreduceOptions, False))
    with pytest.raises(TypeError, match="NCCL cannot reduce"):
        pg._reduce_scatter_base(
            torch.zeros(1).to(dtype), torch.zeros(3).to(dtype), opts(ReduceScatterOptions)
        )
    # Moving data is not reducing it: every dtype moves, as bytes.
    pg.broadcast([x], opts(BroadcastOptions, False)).wait()
    y = torch.ones(2)
    pg.allreduce([y], opts(AllreduceOptions, False)).wait()
    assert not any("failed" in c for c in gpu.calls())
    assert settle(gpu) == []


def test_float8_reductions_need_sm90():
    x = torch.zeros(4, dtype=torch.float8_e4m3fn)
    pg, gpu = fake_group(compute_capability=80)
    with pytest.raises(TypeError, match="float8 reductions need compute capability 9.0"):
        pg.allreduce([x], opts(AllreduceOptions, False))
    pg, gpu = fake_group(compute_capability=90)
    pg.allreduce([x], opts(AllreduceOptions, False)).wait()
    assert "ncclAllReduce(count=4, ncclFloat8e4m3, ncclSum, C0, S0)" in gpu.calls()


# --- risk: a non-blocking NCCL call may return ncclInProgress


def test_an_nccl_call_in_progress_is_waited_for_before_its_end_event():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.in_progress_next("ncclAllReduce", 3)
    x = torch.ones(4)
    pg.allreduce([x], opts(AllreduceOptions)).wait()
    pg.allreduce([x], opts(AllreduceOptions)).wait()
    assert settle(gpu) == []


def test_the_watchdog_never_polls_a_communicator_while_a_call_on_it_is_in_progress():
    # NCCL's ncclCommGetAsyncError completes and frees a call's group job without a lock: the
    # thread that made the call polls it to the end, and the watchdog's poll, every period,
    # must not land in between. Each call here is still being enqueued for 60 of its caller's
    # polls (about 0.1 s, longer than a watchdog period).
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    x = torch.ones(4)
    for _ in range(3):
        gpu.in_progress_next("ncclAllReduce", 60)
        pg.allreduce([x], opts(AllreduceOptions)).wait()
    assert gpu.synchronize()
    assert x.tolist() == [27.0] * 4  # three all_reduces over three mirrored ranks
    assert settle(gpu) == []


# --- D1: CUDA graph capture


CAPTURE_WITH_COLLECTIVES = """
    import time, torch
    from torch._C._distributed_c10d import AllreduceOptions, AllgatherOptions
    pg, gpu = t.fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    x, out = torch.ones(4), torch.empty(12)
    gpu.begin_capture("global")
    pg.allreduce([x], t.opts(AllreduceOptions, False))
    pg._allgather_base(out, x, t.opts(AllgatherOptions, False))
    pg.allreduce([x], t.opts(AllreduceOptions)).wait()
    time.sleep(0.3)  # the watchdog looks at what is in flight meanwhile
    print("capture:", gpu.end_capture())
    pg.allreduce([x], t.opts(AllreduceOptions)).wait()  # and after it, as before
    print("violations:", t.settle(gpu))
"""


@pytest.mark.slow
def test_collectives_can_be_captured_in_a_cuda_graph():
    output = run_child(CAPTURE_WITH_COLLECTIVES)
    assert "capture: ok" in output
    assert "violations: []" in output


CAPTURE_BESIDE_WORK_IN_FLIGHT = """
    import time, torch
    from torch._C._distributed_c10d import AllreduceOptions
    pg, gpu = t.fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)
    pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions))  # in flight, watched
    gpu.begin_capture("global")  # a graph with no collective in it
    y = torch.ones(3) * 2
    time.sleep(0.3)
    print("capture:", gpu.end_capture())
    gpu.hold_events(False)
    print("violations:", t.settle(gpu))
"""


@pytest.mark.slow
def test_the_watchdog_does_not_invalidate_a_capture_on_another_thread():
    output = run_child(CAPTURE_BESIDE_WORK_IN_FLIGHT)
    assert "capture: ok" in output
    assert "violations: []" in output


# --- D5: lazy communicator init that waits for the peers


RANKS_AS_THREADS = """
    import threading, torch
    from datetime import timedelta
    import torch.distributed as dist
    from streamnccl import _testing
    from torch._C._distributed_c10d import AllreduceOptions
    world = t.fakes.fake_world()
    store = dist.HashStore()
    size = {size}
    groups = [t.fake_group(rank=r, size=size, store=store, world=world,
                           timeout=timedelta(seconds=20)) for r in range(size)]
    errors = []

    def rank(r):
        try:
            pg, gpu = groups[r]
            program(r, pg, gpu)
        except BaseException as error:
            errors.append(f"rank {{r}}: {{error!r}}")
    {program}
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    print("stuck:", [r for r, thread in enumerate(threads) if thread.is_alive()])
    print("errors:", errors)
    if not any(thread.is_alive() for thread in threads):
        t.fakes.shut_down(groups)  # at once, as processes would
"""

RING = """
    def program(r, pg, gpu):
        # Each rank first sends to the next one, then receives from the previous: every
        # first contact opens a different pair of lanes.
        pending = pg.send([torch.ones(8)], (r + 1) % size, 0)
        pg.recv([torch.empty(8)], (r - 1) % size, 0).wait()
        pending.wait()
"""

SEND_BESIDE_COLLECTIVE = """
    def program(r, pg, gpu):
        x = torch.ones(4)
        if r == 0:
            pending = pg.send([x], 1, 0)  # its lanes open while rank 1 starts the collective
            pg.allreduce([x], t.opts(AllreduceOptions, False)).wait()
            pending.wait()
        else:
            pg.allreduce([x], t.opts(AllreduceOptions, False)).wait()
            pg.recv([torch.empty(4)], 0, 0).wait()
"""


def _ranks_as_threads(size, program):
    scenario = RANKS_AS_THREADS.format(size=size, program=program)
    return run_child(textwrap.dedent(scenario))


def test_a_ring_of_first_sends_does_not_wait_in_a_circle():
    output = _ranks_as_threads(3, RING)
    assert "stuck: []" in output
    assert "errors: []" in output


def test_a_send_beside_a_peers_first_collective_does_not_deadlock():
    output = _ranks_as_threads(2, SEND_BESIDE_COLLECTIVE)
    assert "stuck: []" in output
    assert "errors: []" in output


ABORT_DURING_INIT = """
    import threading, time, torch
    from datetime import timedelta
    import torch.distributed as dist
    from streamnccl import _testing
    from torch._C._distributed_c10d import AllreduceOptions
    world = t.fakes.fake_world()
    pg, gpu = t.fake_group(rank=0, size=2, world=world, timeout=timedelta(seconds=20))
    outcome = []

    def first_op():  # rank 1 never comes: the communicator's init waits for it
        try:
            pg.allreduce([torch.ones(4)], t.opts(AllreduceOptions, False)).wait()
            outcome.append("completed")
        except Exception as error:
            outcome.append(type(error).__name__ + ": " + str(error))

    thread = threading.Thread(target=first_op, daemon=True)
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    pg.abort()
    print("abort took:", round(time.monotonic() - started, 1))
    thread.join(5)
    print("op:", outcome)
"""


def test_a_lanes_first_ops_wait_for_it_then_run_as_ops_issued_at_once():
    # A lane connects in the background; what is issued to it before then waits in its gate and
    # is issued later, on the connecting thread. It must be issued as it would have been at the
    # call: in program order, with the group's device and the op's stream current (the sends'
    # contiguous copies run on the current stream). Rank 1 joins only once rank 0's sends wait
    # in the gate, so the lane cannot have connected first. (Audit mutants
    # gate-issues-out-of-order, op-stream-not-current, task-without-device.)
    world = fakes.fake_world()
    store = dist.HashStore()
    sender, sender_gpu = fake_group(rank=0, size=2, world=world, store=store, device_index=1)
    sender_gpu.set_device(0)  # the caller's thread has another device current
    sends = [sender.send([torch.full((6, 2), float(n)).t()], 1, 0) for n in (1, 2, 3)]
    assert not [call for call in sender_gpu.calls() if call.startswith("ncclSend(")]
    receiver, receiver_gpu = fake_group(rank=1, size=2, world=world, store=store)
    inboxes = [torch.zeros(12) for _ in sends]
    for inbox in inboxes:
        receiver.recv([inbox], 0, 0).wait(timedelta(seconds=20))
    for work in sends:
        work.wait(timedelta(seconds=20))
    assert receiver_gpu.synchronize(timedelta(seconds=10))
    assert [inbox.unique().tolist() for inbox in inboxes] == [[1.0], [2.0], [3.0]]
    assert settle(sender_gpu) == []
    assert sender_gpu.contexts() == {0, 1}  # 0 by the caller's own choice above
    fakes.shut_down([(sender, sender_gpu), (receiver, receiver_gpu)])


LANE_TORN_DOWN_WHILE_CONNECTING = """
    import gc, time, torch
    from datetime import timedelta
    from streamnccl import _testing
    world = t.fakes.fake_world()
    pg, gpu = t.fake_group(rank=0, size=2, world=world, timeout=timedelta(seconds=1))
    pg.send([torch.ones(4)], 1, 0)  # rank 1 never comes: the lane's work waits in its gate
    del pg  # the group goes while the lane is still connecting
    gc.collect()
    deadline = time.monotonic() + 10
    while "cudaStreamDestroy(S1)" not in gpu.calls() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    print("destroyed:", "cudaStreamDestroy(S1)" in gpu.calls())
    print("violations:", gpu.violations())
"""


@pytest.mark.slow
def test_a_lanes_stream_outlives_the_work_waiting_for_it():
    output = run_child(LANE_TORN_DOWN_WHILE_CONNECTING)
    assert "destroyed: True" in output
    assert "violations: []" in output


@pytest.mark.slow
def test_abort_ends_an_init_waiting_for_a_peer():
    output = run_child(ABORT_DURING_INIT)
    assert "abort took: 0." in output
    assert "op: ['DistBackendError:" in output


# --- timing (Options.enable_timing): events with timing, read once both have passed


def test_a_timed_op_is_timed_between_events_made_with_timing():
    pg, gpu = fake_group(enable_timing=True)
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.clear()
    work = pg.allreduce([torch.ones(8)], opts(AllreduceOptions))
    work.wait()
    assert settle(gpu) == []
    assert work.is_completed()
    # cudaEventElapsedTime fails on events made without timing: the fake refuses it as CUDA does.
    assert work._get_duration() > 0
    calls = gpu.calls()
    assert sum(call.startswith("cudaEventCreate(timing)") for call in calls) == 2, calls
    assert any(call.startswith("cudaEventElapsedTime(") for call in calls), calls


def test_an_untimed_op_makes_no_timing_events_and_has_no_duration():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.clear()
    work = pg.allreduce([torch.ones(8)], opts(AllreduceOptions))
    work.wait()
    assert settle(gpu) == []
    with pytest.raises(ValueError, match="enable_timing=True"):
        work._get_duration()
    assert not [call for call in gpu.calls() if "timing" in call or "Elapsed" in call]


def test_an_asynchronous_nccl_error_fails_the_op_in_flight_and_breaks_the_group():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    gpu.hold_events(True)  # the op stays in flight: only the watchdog's poll can end it
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    gpu.fail_next("ncclCommGetAsyncError")
    with pytest.raises(dist.DistBackendError, match="injected asynchronous error"):
        work.wait(timedelta(seconds=10))
    with pytest.raises(
        dist.DistBackendError, match="unusable since an earlier failure.*asynchronous NCCL error"
    ):
        pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    gpu.hold_events(False)
    assert settle(gpu) == []


def test_stats_count_a_failed_op_as_a_failure():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(torch.device("cpu"))
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions)).wait()
    # The first op has run, though the watchdog may not have looked yet: the break that
    # follows must count it completed, not fail it with the ops in flight.
    assert gpu.synchronize()
    gpu.fail_next("ncclAllReduce")
    with pytest.raises(dist.DistBackendError):
        pg.allreduce([torch.ones(4)], opts(AllreduceOptions)).wait()
    settle(gpu)
    stats = pg._stats()["all_reduce"]
    assert (stats["count"], stats["bytes"], stats["failures"], stats["in_flight"]) == (2, 32, 1, 0)
