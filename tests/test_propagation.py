"""A break on one rank reaches every rank of the group within about a second, whatever their
own timeouts (BreakBoard.hpp): their ops fail naming the rank it broke on, and getError() tells
that rank (TIMEOUT, COMM_ERROR) from the others (REMOTE_ERROR). With propagate_errors=False each
rank keeps to its own timeout, as before."""

import time
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist
from fakes import connect, fake_group, fake_world, run_ranks

ORIGIN_TIMEOUT = timedelta(seconds=2)
OTHERS_TIMEOUT = timedelta(seconds=60)  # never reached where the break propagates
OTHERS_TIMEOUT_UNPROPAGATED = timedelta(seconds=6)  # reached: the test must end


def error_name(group):
    return group._get_backend(torch.device("cpu")).get_error().name


def _a_timeout_on_one_rank(ctx, propagate):
    me = ctx.rank
    others_timeout = OTHERS_TIMEOUT if propagate else OTHERS_TIMEOUT_UNPROPAGATED
    group = dist.new_group(
        backend="streamnccl",
        timeout=ORIGIN_TIMEOUT if me == 0 else others_timeout,
        pg_options=streamnccl.Options(propagate_errors=propagate),
    )
    dist.all_reduce(torch.ones(1), group=group)  # every rank's host path is open
    before = error_name(group)
    started = time.monotonic()
    with pytest.raises(dist.DistBackendError) as failure:
        if me == 0:
            dist.all_reduce(torch.ones(4), group=group)  # which the others never issue
        else:  # ranks 1 and 2 wait for each other, never for rank 0
            dist.recv(torch.empty(4), src=3 - me, group=group)
    waited = time.monotonic() - started
    after = error_name(group)
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
        dist.all_reduce(torch.ones(1), group=group)  # later calls fail at once
    dist.barrier()
    dist.destroy_process_group(group)
    return before, after, str(failure.value), waited


@pytest.mark.parametrize("propagate", [True, False])
def test_a_timeout_on_one_rank_fails_every_ranks_op_naming_it(rank_pools, propagate):
    results = rank_pools(3).run(_a_timeout_on_one_rank, propagate, timeout=60)
    (before, after, error, _) = results[0]
    # Gloo's own deadline (COMM_ERROR) and the watchdog's (TIMEOUT) are both the group's.
    assert before == "SUCCESS" and after in ("TIMEOUT", "COMM_ERROR")
    assert "timed out" in error.lower(), error
    for before, after, error, waited in results[1:]:
        assert before == "SUCCESS"
        if propagate:
            # Learned from rank 0 at its timeout (2 s), not at their own (60 s).
            assert after == "REMOTE_ERROR"
            assert "the group broke on rank 0" in error and "timed out" in error.lower(), error
            assert waited < OTHERS_TIMEOUT.total_seconds() / 2, waited
        else:
            # Each keeps to its own deadline, never rank 0's. Ranks 1 and 2 wait for each other
            # with the same timeout: the first to pass it lets go of its Gloo, which can end the
            # other's recv a moment before its own deadline ("closed by peer", COMM_ERROR).
            assert after in ("TIMEOUT", "COMM_ERROR")
            assert "broke on rank 0" not in error, error
            assert waited > OTHERS_TIMEOUT_UNPROPAGATED.total_seconds() / 2, waited
    if not propagate:
        own_deadlines = [r for r in results[1:] if r[1] == "TIMEOUT"]
        assert own_deadlines, results  # the first of them to pass its own deadline
        for _, _, error, _ in own_deadlines:
            assert "timed out" in error.lower() and "6000" in error, error


def _an_abort(ctx):
    group = dist.new_group(backend="streamnccl", timeout=OTHERS_TIMEOUT)
    dist.all_reduce(torch.ones(1), group=group)
    if ctx.rank == 0:
        group._get_backend(torch.device("cpu")).abort()
        error = ""
    else:
        with pytest.raises(dist.DistBackendError) as failure:
            dist.recv(torch.empty(4), src=3 - ctx.rank, group=group)
        error = str(failure.value)
    after = error_name(group)
    dist.barrier()
    dist.destroy_process_group(group)
    return after, error


def test_an_abort_reaches_every_rank(rank_pools):
    results = rank_pools(3).run(_an_abort, timeout=60)
    assert results[0][0] == "COMM_ERROR"
    for after, error in results[1:]:
        assert after == "REMOTE_ERROR"
        assert "the group broke on rank 0" in error and "aborted by the caller" in error, error


def test_the_nccl_path_breaks_on_every_rank_when_one_times_out():
    # Over the fake GPU: rank 0's all_reduce, which the others never issue, passes its deadline;
    # ranks 1 and 2, whose timeouts are a minute, break with it at once: their op in flight
    # (rank 1's send, which rank 2 never receives) fails naming rank 0, and every communicator
    # is aborted, after those ops failed.
    from streamnccl import _testing  # noqa: F401  (the test doubles)

    world, store = fake_world(), dist.HashStore()
    groups = connect([
        fake_group(rank=r, size=3, store=store, world=world, propagate_errors=True,
                   timeout=ORIGIN_TIMEOUT if r == 0 else OTHERS_TIMEOUT)
        for r in range(3)
    ])  # fmt: skip

    def one_times_out(rank, pg, gpu):
        gpu.clear()
        work = None
        if rank == 0:
            work = pg.allreduce([torch.ones(4)])
        elif rank == 1:
            work = pg.send([torch.ones(4)], 2, 0)
        deadline = time.monotonic() + OTHERS_TIMEOUT.total_seconds() / 2
        while pg.get_error().name == "SUCCESS" and time.monotonic() < deadline:
            time.sleep(0.05)  # a CUDA wait() does not block the host: the break is waited for
        calls = gpu.calls()
        gpu.clear()
        with pytest.raises(dist.DistBackendError) as failure:
            if work is not None:
                work.wait()  # failed by the break
            else:
                pg.allreduce([torch.ones(4)])  # refused: the group broke
        joined = any(call.startswith("cudaStreamWaitEvent(S0,") for call in gpu.calls())
        return pg.get_error().name, str(failure.value), calls, joined

    results = run_ranks(groups, one_times_out, timeout_s=OTHERS_TIMEOUT.total_seconds() / 2)
    assert results[0][0] == "TIMEOUT"
    # A failed op's wait() still orders the caller's stream after it: after the abort, the
    # kernels queued behind the communicator's (copy-backs into the outputs) still run.
    assert results[0][3] and results[1][3]
    for name, error, calls, _ in results[1:]:
        assert name == "REMOTE_ERROR"
        assert "the group broke on rank 0" in error and "timed out" in error, error
        assert any(call.startswith("ncclCommAbort") for call in calls), calls
    for pg, gpu in groups:
        pg.abort()
        assert gpu.violations() == []


def test_get_error_tells_of_a_break_once_the_ops_it_took_out_of_flight_have_failed(tmp_path):
    # Over the fake GPU: rank 0's all_reduce, which rank 1 never issues, passes its deadline.
    # The break writes rank 0's dump, then fails the op. The dump's file is a FIFO here, whose
    # writer waits until it is read: the break is held between the two until the test reads it
    # (about 4 s after the deadline). Whoever sees get_error() tell of the break must find the
    # op failed. It told at once, before the op had failed, whose wait() then returned as if
    # nothing were wrong (met once in a full run); now it waits until the op has failed.
    import contextlib
    import os
    import threading

    from streamnccl import _testing  # noqa: F401  (the test doubles)

    fifo = tmp_path / ".writing_rank_0"  # where rank 0's dump is written, then renamed
    os.mkfifo(fifo)
    released = threading.Event()

    def read_the_dump_once_released():
        released.wait(ORIGIN_TIMEOUT.total_seconds() + 4)
        with open(fifo, "rb") as dump:
            dump.read()

    reader = threading.Thread(target=read_the_dump_once_released, daemon=True)
    world, store = fake_world(), dist.HashStore()
    groups = connect([
        fake_group(rank=r, size=2, store=store, world=world, dump_dir=str(tmp_path),
                   propagate_errors=False,
                   timeout=ORIGIN_TIMEOUT if r == 0 else OTHERS_TIMEOUT)
        for r in range(2)
    ])  # fmt: skip
    pg = groups[0][0]
    try:
        reader.start()
        work = pg.allreduce([torch.ones(4)])
        deadline = time.monotonic() + OTHERS_TIMEOUT.total_seconds() / 2
        while pg.get_error().name == "SUCCESS":
            assert time.monotonic() < deadline, "the group never broke"
            time.sleep(0.01)
        assert pg.get_error().name == "TIMEOUT"
        with pytest.raises(dist.DistBackendError, match="timed out"):
            work.wait()
    finally:
        released.set()
        reader.join(10)
        if reader.is_alive():  # no dump was written: let the reader's open() return
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        fifo.unlink(missing_ok=True)  # the aborts' dumps must not wait for a reader
        for group, _ in groups:
            group.abort()


def test_a_store_that_does_not_answer_delays_a_break_by_a_bounded_time():
    # The break's post to the Store hangs: the group still breaks (later ops refused, its
    # communicator aborted) within the roll call and a second, rather than with the Store.
    from streamnccl import _testing

    store = _testing.StoreThatHangsOnPosts()
    pg, gpu = fake_group(store=store, propagate_errors=True, timeout=timedelta(seconds=60))
    try:
        connect([(pg, gpu)])
        started = time.monotonic()
        pg.abort()
        aborted_after = time.monotonic() - started
        with pytest.raises(dist.DistBackendError, match="aborted by the caller"):
            pg.allreduce([torch.ones(4)])
        assert aborted_after < 10, aborted_after  # unbounded, it waits for `release` (60 s)
        assert pg.get_error().name == "COMM_ERROR"
        assert any(call.startswith("ncclCommAbort") for call in gpu.calls())
    finally:
        store.release()
