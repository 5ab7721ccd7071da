"""Teardown finishes what was issued: destroy_process_group() (and a group's shutdown()) waits
for every op in flight to complete before the communicators go, as gloo and the built-in nccl
do, so that no rank's result is lost; only a broken group, or a flush that runs past the
group's timeout, aborts instead, and the op left unfinished says so."""

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

GROUP_TIMEOUT_S = 3


def _destroy_with_ops_in_flight(ctx, count):
    n, me = ctx.world_size, ctx.rank
    group = dist.new_group(backend="streamnccl")
    tensors = [torch.full((1000,), float(me + i)) for i in range(count)]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    # Point-to-point on the lanes too: a receive from the left, a send to the right.
    inbox = torch.zeros(4)
    dist.irecv(inbox, src=(me - 1) % n, group=group)
    dist.isend(torch.full((4,), float(me)), (me + 1) % n, group=group)
    dist.destroy_process_group(group)  # no wait(): destroy must finish them
    for i, t in enumerate(tensors):
        assert torch.equal(t, torch.full((1000,), float(sum(r + i for r in range(n))))), i
    assert torch.equal(inbox, torch.full((4,), float((me - 1) % n)))
    assert all(work.is_completed() and work.is_success() for work in works)
    return True


@pytest.mark.parametrize("world_size", [2, 3])
def test_destroy_finishes_the_ops_in_flight(rank_pools, world_size):
    assert rank_pools(world_size).run(_destroy_with_ops_in_flight, 8) == [True] * world_size


def _shutdown_with_ops_in_flight(ctx):
    n, me = ctx.world_size, ctx.rank
    group = dist.new_group(backend="streamnccl")
    x = torch.full((16,), float(me))
    dist.all_reduce(x, group=group, async_op=True)
    group._get_backend(torch.device("cpu")).shutdown()  # what destroy_process_group calls
    assert torch.equal(x, torch.full((16,), float(sum(range(n)))))
    with pytest.raises(dist.DistBackendError, match="allreduce: the group was shut down"):
        dist.all_reduce(x, group=group)
    dist.destroy_process_group(group)  # shutting down again does nothing
    return True


@pytest.mark.parametrize("world_size", [2])
def test_shutdown_finishes_the_ops_in_flight_and_then_refuses_ops(rank_pools, world_size):
    assert rank_pools(world_size).run(_shutdown_with_ops_in_flight) == [True] * world_size


def _flush_past_the_timeout(ctx):
    me = ctx.rank
    group = dist.new_group(backend="streamnccl", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    x = torch.ones(4)
    dist.all_reduce(x, group=group)
    if me == 1:
        # Rank 0 never issues this one: the flush cannot finish it.
        unmatched = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    dist.barrier(group=ctx.gloo)  # rank 1's op is issued
    if me == 0:  # rank 0 keeps its side open (a live peer that never issues the op)
        dist.barrier(group=ctx.gloo)
    started = time.monotonic()
    try:
        dist.destroy_process_group(group)
        took = time.monotonic() - started
        if me == 1:
            # Whichever deadline comes first ends it: the op's own (the watchdog's, or Gloo's
            # in the host path), or the teardown's, counted from the destroy. (The teardown's
            # own message is pinned over the fake GPU, where the op's deadline can be later.)
            with pytest.raises(dist.DistBackendError, match=r"allreduce #2 \(\[4\], Float\)"):
                unmatched.wait()
    finally:
        if me == 1:
            dist.barrier(group=ctx.gloo)
    return took


def test_a_flush_past_the_timeout_aborts_and_says_which_op(rank_pools):
    took = rank_pools(2).run(_flush_past_the_timeout)
    assert took[0] < 2, took  # nothing of rank 0's was in flight
    assert GROUP_TIMEOUT_S - 1 < took[1] < GROUP_TIMEOUT_S + 5, took
