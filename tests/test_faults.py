"""Faults end in a DistBackendError within the timeout, leave evidence, and end the group:
a rank whose op fails (STREAMNCCL_TEST_FAULT) is a silent peer to the others."""

import os
import pickle
import shutil
import tempfile
import time
from datetime import timedelta

import pytest
import streamnccl
import streamnccl._testing  # noqa: F401 (STREAMNCCL_TEST_FAULT is its hook)
import torch
import torch.distributed as dist
from blocked_dump import BlockedDump

GROUP_TIMEOUT_S = 3
FAULTY_RANK, FAULTY_OP = 1, 2


def faulty_group(dump_dir):
    """A group with a short timeout whose op FAULTY_OP fails on FAULTY_RANK."""
    os.environ["STREAMNCCL_DUMP_DIR"] = dump_dir
    os.environ["STREAMNCCL_TEST_FAULT"] = f"rank={FAULTY_RANK},op={FAULTY_OP},action=fail"
    try:
        return dist.new_group(backend="streamnccl", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    finally:  # later groups of this process must not inherit the fault
        del os.environ["STREAMNCCL_DUMP_DIR"], os.environ["STREAMNCCL_TEST_FAULT"]


def group_with_dump(rank):
    """A group with a short timeout that dumps its flight recorder to a fresh directory."""
    dump_dir = tempfile.mkdtemp(prefix=f"streamnccl-dump-rank{rank}-")
    group = dist.new_group(
        backend="streamnccl",
        timeout=timedelta(seconds=GROUP_TIMEOUT_S),
        pg_options=streamnccl.Options(dump_dir=dump_dir),
    )
    return group, dump_dir


def read_dump(dump_dir, rank, group):
    """The entries of `group` in the flight recorder this rank dumped (torch's format)."""
    with open(os.path.join(dump_dir, f"streamnccl_trace_rank_{rank}"), "rb") as file:
        dump = pickle.load(file)
    return [e for e in dump["entries"] if e["process_group"][0] == group.group_name]


def _silent_peer(ctx, async_op):
    n, me = ctx.world_size, ctx.rank
    dump_dir = tempfile.mkdtemp(prefix=f"streamnccl-dump-rank{me}-")
    group = faulty_group(dump_dir)
    x = torch.ones(4)
    dist.all_reduce(x, group=group)  # op 1 is fine everywhere
    assert x[0].item() == n

    started = time.monotonic()
    with pytest.raises(dist.DistBackendError) as failure:
        work = dist.all_reduce(torch.ones(4), group=group, async_op=async_op)  # op 2
        if async_op:
            work.wait()
    detected_after = time.monotonic() - started
    message = str(failure.value)
    assert f"[streamnccl rank {me}/{n} pg=" in message and "allreduce #2 ([4], Float)" in message
    assert "injected fault" in message, message
    if me != FAULTY_RANK:
        assert f"the group broke on rank {FAULTY_RANK}" in message, message
    assert detected_after < GROUP_TIMEOUT_S + 10, detected_after

    # The group is broken: a later call raises at once, with the first cause.
    started = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
        dist.broadcast(torch.ones(2), src=0, group=group)
    assert time.monotonic() - started < 1

    # The flight recorder's dump has the failed op, never completed, after the one that did.
    entries = read_dump(dump_dir, me, group)
    states = [(e["collective_seq_id"], e["profiling_name"], e["state"]) for e in entries]
    assert states == [(1, "nccl:all_reduce", "completed"), (2, "nccl:all_reduce", "started")]
    assert entries[1]["input_sizes"] == [[4]] and entries[1]["input_dtypes"] == ["Float"]
    assert "error" not in entries[0], entries
    if me == FAULTY_RANK or async_op:
        assert entries[1]["retired"] and "error" in entries[1], entries
    # Else the others' sync op was inside Gloo, outside the watchdog's sight, when their group
    # broke from the post: the dump shows it started and never completed, where the ranks
    # parted, and its failure came after (the closed connections of the failing rank).

    dist.destroy_process_group(group)
    shutil.rmtree(dump_dir)
    z = torch.ones(1)
    dist.all_reduce(z)  # other groups are unaffected
    assert z.item() == n
    return detected_after


@pytest.mark.slow
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_failing_rank_is_a_silent_peer_to_the_others(rank_pools, world_size, async_op):
    detected_after = rank_pools(world_size).run(_silent_peer, async_op)
    # The failing rank knows at once; the others from its break, posted to the Store (without
    # propagation, when the group's timeout passes: tests/test_propagation.py).
    assert detected_after[FAULTY_RANK] < 1, detected_after
    others = [t for r, t in enumerate(detected_after) if r != FAULTY_RANK]
    assert all(t < GROUP_TIMEOUT_S - 1 for t in others), detected_after


def _watchdog_times_out_an_async_op(ctx):
    # Rank 1 starts op 2 late, past the group's timeout: rank 0's watchdog fails it without
    # anyone waiting, and a later call raises the timeout at once.
    me = ctx.rank
    dump_dir = tempfile.mkdtemp(prefix=f"streamnccl-dump-rank{me}-")
    os.environ["STREAMNCCL_DUMP_DIR"] = dump_dir
    os.environ["STREAMNCCL_TEST_FAULT"] = f"rank=1,op=2,action=delay,ms={GROUP_TIMEOUT_S * 2000}"
    try:
        group = dist.new_group(backend="streamnccl", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    finally:
        del os.environ["STREAMNCCL_DUMP_DIR"], os.environ["STREAMNCCL_TEST_FAULT"]
    dist.all_reduce(torch.ones(1), group=group)
    work = dist.all_reduce(torch.ones(3), group=group, async_op=True)
    if me == 0:
        time.sleep(GROUP_TIMEOUT_S + 1)  # not waiting: the watchdog must notice on its own
        with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
            dist.all_reduce(torch.ones(1), group=group)
        assert os.path.exists(os.path.join(dump_dir, "streamnccl_trace_rank_0"))
    with pytest.raises(dist.DistBackendError):
        work.wait()
    dist.destroy_process_group(group)
    shutil.rmtree(dump_dir)
    return True


@pytest.mark.slow
def test_the_watchdog_fails_an_op_past_its_deadline(rank_pools):
    assert rank_pools(2).run(_watchdog_times_out_an_async_op) == [True, True]


def _dead_peer(ctx, async_op):
    n, me = ctx.world_size, ctx.rank
    group, dump_dir = group_with_dump(me)
    dist.all_reduce(torch.ones(1), group=group)
    if me == n - 1:
        os._exit(0)  # the peer dies between two collectives
    started = time.monotonic()
    with pytest.raises(dist.DistBackendError, match=r"allreduce #2 \(\[4\], Float\)"):
        work = dist.all_reduce(torch.ones(4), group=group, async_op=async_op)
        if async_op:
            work.wait()
    detected_after = time.monotonic() - started
    assert "error" in read_dump(dump_dir, me, group)[-1]
    shutil.rmtree(dump_dir)
    started = time.monotonic()
    dist.destroy_process_group(group)
    return detected_after, time.monotonic() - started


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_dead_peer_is_an_error_within_the_timeout(rank_pools, world_size, async_op):
    results = rank_pools(world_size).run(_dead_peer, async_op, expect_deaths=[world_size - 1])
    for detected_after, destroyed_after in results[:-1]:
        assert detected_after < GROUP_TIMEOUT_S + 10, results
        assert destroyed_after < 5, results


def _abort(ctx):
    # Rank 0 has ops in flight that rank 1 never joins; aborting the group returns at once,
    # the ops fail (the one inside Gloo at Gloo's timeout, the queued ones at once), and the
    # group refuses later calls.
    me = ctx.rank
    group = dist.new_group(backend="streamnccl", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    dist.all_reduce(torch.ones(1), group=group)
    waited = None
    if me == 0:
        works = [dist.all_reduce(torch.ones(4), group=group, async_op=True) for _ in range(5)]
        time.sleep(0.2)
        started = time.monotonic()
        group._get_backend(torch.device("cpu")).abort()
        aborted_after = time.monotonic() - started
        assert aborted_after < 1, aborted_after
        started = time.monotonic()
        for work in works:
            with pytest.raises(dist.DistBackendError):
                work.wait()
        waited = time.monotonic() - started
        with pytest.raises(dist.DistBackendError, match="aborted by the caller"):
            dist.all_reduce(torch.ones(1), group=group)
    dist.barrier()  # rank 1 keeps its side of the group open until rank 0 is done
    started = time.monotonic()
    dist.destroy_process_group(group)
    return waited, time.monotonic() - started


@pytest.mark.slow
def test_abort_returns_at_once_and_the_group_refuses_later_calls(rank_pools):
    (waited, destroyed), _ = rank_pools(2).run(_abort)
    assert waited < GROUP_TIMEOUT_S + 5, waited
    assert destroyed < 5, destroyed


def _mismatched_collectives(ctx):
    me = ctx.rank
    group = dist.new_group(backend="streamnccl", pg_options=streamnccl.Options(debug_checks=True))
    x = torch.full((4,), float(me))
    dist.all_reduce(x, group=group)  # matched: runs as usual
    assert x[0].item() == 1.0
    if me == 0:  # point-to-point takes no part in the checks
        dist.send(torch.ones(1), dst=1, group=group)
    else:
        dist.recv(torch.empty(1), src=0, group=group)
    with pytest.raises(dist.DistBackendError) as mismatch:
        if me == 0:
            dist.all_reduce(torch.ones(4), group=group)
        else:
            dist.broadcast(torch.ones(4), src=0, group=group)
    mine, theirs = ("allreduce", "broadcast") if me == 0 else ("broadcast", "allreduce")
    assert (
        f"debug check failed: this rank issued {mine} ([4], Float) but rank {1 - me} issued "
        f"{theirs} ([4], Float)"
    ) in str(mismatch.value)
    dist.destroy_process_group(group)

    group = dist.new_group(backend="streamnccl", pg_options=streamnccl.Options(debug_checks=True))
    with pytest.raises(dist.DistBackendError, match=r"issued allreduce \(\[\d\], Float\) but"):
        dist.all_reduce(torch.ones(4 + me), group=group)  # shapes differ
    dist.destroy_process_group(group)

    # Split sizes given on one rank only: equal blocks either way, but on NCCL one rank would
    # call ncclAlltoAll and the other send and receive.
    group = dist.new_group(backend="streamnccl", pg_options=streamnccl.Options(debug_checks=True))
    with pytest.raises(
        dist.DistBackendError,
        match=r"no split sizes\) but rank \d issued .*"
        r"split sizes given|split sizes given\) but rank \d issued .*no split",
    ):
        splits = [2, 2] if me == 0 else None
        dist.all_to_all_single(torch.empty(4), torch.ones(4), splits, splits, group=group)
    dist.destroy_process_group(group)
    return True


def test_debug_checks_name_both_sides_of_a_mismatch(rank_pools):
    assert rank_pools(2).run(_mismatched_collectives) == [True, True]


def _skipping_peer(ctx, async_op):
    # The last rank simply never calls op 2; the others time out on it and dump.
    n, me = ctx.world_size, ctx.rank
    group, dump_dir = group_with_dump(me)
    dist.all_reduce(torch.ones(1), group=group)
    detected_after = None
    if me != n - 1:
        started = time.monotonic()
        with pytest.raises(dist.DistBackendError, match=r"allreduce #2 \(\[4\], Float\)"):
            work = dist.all_reduce(torch.ones(4), group=group, async_op=async_op)
            if async_op:
                work.wait()
        detected_after = time.monotonic() - started
        last = read_dump(dump_dir, me, group)[-1]
        assert (last["collective_seq_id"], last["profiling_name"]) == (2, "nccl:all_reduce"), last
        assert last["state"] != "completed" and "error" in last, last
    dist.barrier()  # the skipping rank keeps its side open until the others are done
    dist.destroy_process_group(group)
    shutil.rmtree(dump_dir)
    return detected_after


def _failure_hidden_until_dumped(ctx):
    # Rank 1 never calls op 2; rank 0's dump blocks. While it does, the op must not have failed
    # yet, or a caller polling for the failure (a blocking wait, a wait with a timeout) would
    # raise before the dump exists.
    me = ctx.rank
    group, dump_dir = group_with_dump(me)
    dist.all_reduce(torch.ones(1), group=group)
    if me == 0:
        with BlockedDump(dump_dir, dist.get_rank()) as blocked:
            work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
            blocked.wait_for_writer(timeout_s=GROUP_TIMEOUT_S + 30)
            assert work.is_success(), "the op failed before its dump was written"
            dump = blocked.read()
        with pytest.raises(
            dist.DistBackendError, match=r"allreduce #2 \(\[4\], Float\): .*(?i:timed out)"
        ):
            work.wait()
        entries = [e for e in dump["entries"] if e["process_group"][0] == group.group_name]
        assert entries[-1]["collective_seq_id"] == 2 and "error" in entries[-1], entries[-1]
    dist.barrier()  # the skipping rank keeps its side open until rank 0 is done
    dist.destroy_process_group(group)
    shutil.rmtree(dump_dir)
    return True


@pytest.mark.slow
def test_an_op_fails_only_once_its_dump_is_written(rank_pools):
    assert rank_pools(2).run(_failure_hidden_until_dumped) == [True, True]


@pytest.mark.slow
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_peer_that_skips_a_collective_is_an_error_within_the_timeout(
    rank_pools, world_size, async_op
):
    detected_after = rank_pools(world_size).run(_skipping_peer, async_op)[:-1]
    assert all(GROUP_TIMEOUT_S - 1 < t < GROUP_TIMEOUT_S + 10 for t in detected_after), (
        detected_after
    )
