"""shrink on the NCCL path, over the fake GPU: the survivors of a group shrink its communicator
with ncclCommShrink where every one of them still has it, and connect afresh where one does
not (a broken group's communicators were aborted); the new group reduces among them alone.
"""

import gc
import threading
import time
from datetime import timedelta

import pytest
import streamnccl
import torch
from fakes import connect, fake_group, fake_ranks, needs_nccl_path, opts, run_ranks, shut_down
from streamnccl import _testing
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions

pytestmark = needs_nccl_path
SHRINK_DEFAULT, SHRINK_ABORT = 0, 1


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _testing.FakeGpu.forget_thread_device()


def _all_reduce(pg, gpu, value):
    tensor = torch.full((4,), float(value))
    pg.allreduce([tensor], opts(AllreduceOptions, False)).wait()
    gpu.synchronize()
    return tensor


def _gather_ranks(pg, gpu, value):
    outputs = [torch.zeros(2) for _ in range(pg.size())]
    pg.allgather([outputs], [torch.full((2,), float(value))], opts(AllgatherOptions)).wait()
    gpu.synchronize()
    return [int(out[0]) for out in outputs]


def _shrink_and_gather(rank, pg, gpu, flags=SHRINK_DEFAULT):
    gpu.clear()
    small = pg.shrink([2], flags)
    gathered = _gather_ranks(small, gpu, value=10 + rank)
    return small, gathered, gpu.calls()


def _survivors(groups, program):
    """Runs program on ranks 0 and 1 of three: rank 2 is gone, it takes no part."""
    return run_ranks(groups[:2], program)


def _end(groups, results):
    """Ends the new groups together, as their ranks would, and rank 2's old one (which in a
    real job died with its rank)."""
    shut_down([(small, gpu) for (small, _, _), (_, gpu) in zip(results, groups[:2], strict=True)])
    groups[2][0].abort()


def test_survivors_shrink_the_communicator_and_gather_among_themselves():
    groups = connect(fake_ranks(3))
    results = _survivors(groups, _shrink_and_gather)
    for rank, (small, gathered, calls) in enumerate(results):
        assert (small.rank(), small.size()) == (rank, 2)
        assert gathered == [10, 11]  # rank 2's slot is gone, the others in their new order
        # The pinned sequence: the communicator is shrunk, not made afresh, then used.
        assert calls[0] == f"ncclCommShrink(C0, exclude=[2]) -> C1 (rank {rank} of 2)", calls
        assert not [c for c in calls if c.startswith(("ncclGetUniqueId", "ncclCommInitRank"))]
        assert any(c.startswith("ncclAllGather") and "C1" in c for c in calls), calls
    _end(groups, results)
    for _, gpu in groups:
        assert gpu.violations() == []


def test_a_broken_group_shrinks_to_fresh_communicators():
    groups = connect(fake_ranks(3))

    def break_then_shrink(rank, pg, gpu):
        pg.abort()  # as a rank's death breaks it: the watchdog aborted its communicators
        return _shrink_and_gather(rank, pg, gpu)

    results = _survivors(groups, break_then_shrink)
    for rank, (_, gathered, calls) in enumerate(results):
        assert gathered == [10, 11]
        assert not [c for c in calls if c.startswith("ncclCommShrink")], calls
        assert f"ncclCommInitRank(nranks=2, rank={rank}, nonblocking) -> C1" in calls, calls
    _end(groups, results)


def test_survivors_shrink_only_what_every_one_of_them_still_has():
    # Rank 0's group broke, rank 1's not yet: had rank 1 called ncclCommShrink, it would wait
    # for rank 0, which cannot take part any more. They agree to connect afresh instead.
    groups = connect(fake_ranks(3))

    def rank_zero_broke(rank, pg, gpu):
        if rank == 0:
            pg.abort()
        return _shrink_and_gather(rank, pg, gpu)

    results = _survivors(groups, rank_zero_broke)
    for _, gathered, calls in results:
        assert gathered == [10, 11]
        assert not [c for c in calls if c.startswith("ncclCommShrink")], calls
    _end(groups, results)


def test_shrink_abort_ends_the_old_groups_ops_in_flight():
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=30)))

    def stuck_then_shrink(rank, pg, gpu):
        stuck = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))  # rank 2 never joins
        small, gathered, calls = _shrink_and_gather(rank, pg, gpu, SHRINK_ABORT)
        with pytest.raises(torch.distributed.DistBackendError, match="SHRINK_ABORT"):
            stuck.wait()
        return small, gathered, calls

    results = _survivors(groups, stuck_then_shrink)
    for rank, (_, gathered, calls) in enumerate(results):
        assert gathered == [10, 11]
        shrink = f"ncclCommShrink(C0, exclude=[2], abort) -> C1 (rank {rank} of 2)"
        # NCCL's abort of the old ops comes first, the old group's ncclCommAbort only after.
        assert calls.index(shrink) < calls.index("ncclCommAbort(C0)"), calls
    _end(groups, results)


def _ended(pg, op="all_reduce"):
    stats = pg._stats().get(op, {})
    return stats.get("count", 0) > 0 and stats.get("in_flight", 1) == 0


def test_shrink_abort_fails_the_old_ops_before_their_kernels_stop():
    # ncclCommShrink with NCCL_SHRINK_ABORT stops the old ops' kernels at once, and a survivor
    # then waits inside it for the others: an op whose kernel quit passes its end event like one
    # that ran. Here the shrink is held in progress until the old op has ended on the group's
    # books: it must have ended failed, not completed over unreduced data.
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=30)))

    def shrink_held_until_the_old_op_ended(rank, pg, gpu):
        stuck = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))  # rank 2 never joins
        gpu.hold_shrinks(True)

        def release():
            deadline = time.monotonic() + 20
            while not _ended(pg) and time.monotonic() < deadline:
                time.sleep(0.005)  # polling a condition: the watchdog's period decides when
            gpu.hold_shrinks(False)

        releaser = threading.Thread(target=release)
        releaser.start()
        try:
            small, gathered, calls = _shrink_and_gather(rank, pg, gpu, SHRINK_ABORT)
        finally:
            gpu.hold_shrinks(False)
            releaser.join()
        with pytest.raises(torch.distributed.DistBackendError, match="SHRINK_ABORT"):
            stuck.wait()
        assert pg._stats()["all_reduce"]["failures"] == 1
        return small, gathered, calls

    results = _survivors(groups, shrink_held_until_the_old_op_ended)
    assert [gathered for _, gathered, _ in results] == [[10, 11], [10, 11]]
    _end(groups, results)


class _GoneStore(torch.distributed.Store):
    """A Store whose host died with the rank that ran it: every request fails."""

    def __init__(self):
        super().__init__()  # without it, torch's Store sees none of the methods below

    def set(self, key, value):
        raise RuntimeError("the Store's host is gone")

    def get(self, key):
        raise RuntimeError("the Store's host is gone")

    def add(self, key, value):
        raise RuntimeError("the Store's host is gone")

    def check(self, keys):
        raise RuntimeError("the Store's host is gone")


def test_shrink_abort_with_survivors_arriving_apart():
    # The race of a real job: rank 0 shrinks at once (its old op's kernel stops there) and then
    # waits inside ncclCommShrink; rank 1 comes only once rank 0's old op has ended on rank 0's
    # books. That op must have ended failed.
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=30)))

    def arriving_apart(rank, pg, gpu):
        stuck = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))  # rank 2 never joins
        if rank == 1:
            deadline = time.monotonic() + 20
            while not _ended(groups[0][0]) and time.monotonic() < deadline:
                time.sleep(0.005)  # polling a condition: rank 0's watchdog decides when
        small, gathered, calls = _shrink_and_gather(rank, pg, gpu, SHRINK_ABORT)
        with pytest.raises(torch.distributed.DistBackendError, match="SHRINK_ABORT"):
            stuck.wait()
        return small, gathered, calls

    results = _survivors(groups, arriving_apart)
    assert [gathered for _, gathered, _ in results] == [[10, 11], [10, 11]]
    assert groups[0][0]._stats()["all_reduce"]["failures"] == 1
    _end(groups, results)


def test_a_shrink_with_no_communicator_open_needs_no_store():
    # Nothing to agree on: the survivors' new group connects afresh at its first op.
    store = _GoneStore()  # kept: torch's Store holds the Python object's methods, not it
    pg, gpu = fake_group(rank=0, size=3, store=store)
    small = pg.shrink([2])
    assert (small.rank(), small.size()) == (0, 2)
    assert [c for c in gpu.calls() if "ncclComm" in c] == []
    small.abort()
    pg.abort()


def test_an_nccl_without_comm_shrink_is_refused_at_the_call():
    groups = connect(fake_ranks(3))

    def old_nccl(rank, pg, gpu):
        gpu.set_nccl_version(22605)
        with pytest.raises(RuntimeError, match=r"NCCL 2\.27 or newer.*2\.26\.5"):
            pg.shrink([2])

    run_ranks(groups[:2], old_nccl)
    assert [c for c in groups[0][1].calls() if "ncclCommShrink" in c] == []
    # Nothing was issued: the group goes on, every rank in it.
    sums = run_ranks(groups, lambda rank, pg, gpu: _all_reduce(pg, gpu, rank + 1))
    assert [s.tolist() for s in sums] == [[6.0] * 4] * 3
    shut_down(groups)


@pytest.mark.slow
def test_a_remaining_rank_that_never_shrinks_fails_the_others_within_the_timeout():
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=2)))
    pg, gpu = groups[0]
    with pytest.raises(torch.distributed.DistBackendError, match="not every rank that takes part"):
        pg.shrink([2])
    assert [c for c in gpu.calls() if "ncclCommShrink" in c] == []
    shut_down(groups)


def test_a_survivor_that_gives_up_ends_the_others_shrink_and_a_second_shrink_works():
    # Rank 0's ncclCommShrink fails: rank 1, whose NCCL would wait for rank 0 until its
    # timeout (a minute here), ends at once and says why. Both count the shrink as done, so
    # the next one meets, afresh where a communicator was aborted to end the first.
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=60)))

    def one_gives_up(rank, pg, gpu):
        gpu.clear()
        if rank == 0:
            gpu.fail_next("ncclCommShrink")
        expected = "injected failure" if rank == 0 else "another member gave up.*injected"
        with pytest.raises(torch.distributed.DistBackendError, match=expected):
            pg.shrink([2])
        first_calls = gpu.calls()
        small, gathered, _ = _shrink_and_gather(rank, pg, gpu)
        return small, gathered, first_calls

    results = _survivors(groups, one_gives_up)
    for _, gathered, _ in results:
        assert gathered == [10, 11]
    # Rank 1's NCCL was still making the new communicator: only the parent's abort ends that,
    # and the new one it then hands out, failed, is freed too.
    rank_one_calls = results[1][2]
    assert rank_one_calls.index("ncclCommAbort(C0)") < rank_one_calls.index("ncclCommAbort(C1)")
    _end(groups, results)
    for _, gpu in groups[:2]:
        assert gpu.violations() == []


def test_the_shrunk_communicator_outlives_the_old_groups_abort():
    # Had the old communicator been made with shrinkShare, NCCL would give the new one its
    # abort flag, and the old group's abort (it ends broken) would stop the new group too.
    groups = connect(fake_ranks(3))

    def shrink_then_abort_the_old_group(rank, pg, gpu):
        small, _, calls = _shrink_and_gather(rank, pg, gpu)
        pg.abort()
        return small, _gather_ranks(small, gpu, value=20 + rank), calls

    results = _survivors(groups, shrink_then_abort_the_old_group)
    for _, gathered, calls in results:
        assert gathered == [20, 21]
        assert not [c for c in calls if "sharing its parent's resources" in c], calls
    _end(groups, results)


def test_a_shrink_refuses_the_variable_that_would_share_the_old_communicators_abort_flag(
    monkeypatch,
):
    # Set after the group was made: the shrink refuses it at the call, before any NCCL call,
    # and the group goes on.
    groups = connect(fake_ranks(3))
    monkeypatch.setenv("NCCL_COMM_SHRINK_SHARE_RESOURCES", "1")

    def refused_then_used(rank, pg, gpu):
        gpu.clear()
        if rank != 2:  # the one it would leave out takes no part
            with pytest.raises(ValueError, match="NCCL_COMM_SHRINK_SHARE_RESOURCES is set"):
                pg.shrink([2])
        assert not [c for c in gpu.calls() if "ncclCommShrink" in c]
        return _all_reduce(pg, gpu, value=1 + rank)

    for tensor in run_ranks(groups, refused_then_used):
        assert tensor.tolist() == [6.0] * 4
    shut_down(groups)


def test_the_new_groups_pg_options_make_its_communicator():
    # shrink_group's pg_options are the new group's: NCCL makes its communicator with their
    # config (the old group's has none here).
    groups = connect(fake_ranks(3))
    new_settings = streamnccl.Options(config=streamnccl.NcclConfig(max_ctas=8))

    def shrink_with_options(rank, pg, gpu):
        gpu.clear()
        small = pg.shrink([2], SHRINK_DEFAULT, new_settings)
        return small, _gather_ranks(small, gpu, value=10 + rank), gpu.calls()

    results = _survivors(groups, shrink_with_options)
    for rank, (_, gathered, calls) in enumerate(results):
        assert gathered == [10, 11]
        assert calls[0] == (
            f"ncclCommShrink(C0, exclude=[2], config{{maxCTAs=8}}) -> C1 (rank {rank} of 2)"
        ), calls
    _end(groups, results)
