"""Load and teardown: many small ops, many async ops in flight at once, steady memory, and a
group destroyed with work in flight leaves no thread or file descriptor behind."""

import os

import pytest
import threads
import torch
import torch.distributed as dist


def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def _small_ops_in_a_loop(ctx, count):
    n, me = ctx.world_size, ctx.rank
    x = torch.zeros(4)
    for _ in range(1000):  # warm-up: allocator pools, lanes, Gloo buffers
        dist.all_reduce(x)
    before = resident_mib()
    for i in range(count):
        x.fill_(float(me + i))
        dist.all_reduce(x)
        if i % 997 == 0:  # a sample, checked as it goes
            assert x[0].item() == float(sum(r + i for r in range(n))), i
    growth = resident_mib() - before
    assert x[0].item() == float(sum(r + count - 1 for r in range(n)))
    return growth


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2])
def test_ten_thousand_small_ops_keep_memory_steady(rank_pools, world_size):
    growth = rank_pools(world_size).run(_small_ops_in_a_loop, 10_000)
    assert max(growth) < 50, f"resident memory grew by {growth} MiB"


def _many_in_flight(ctx, count):
    n, me = ctx.world_size, ctx.rank
    tensors = [torch.full((8,), float(me * count + i)) for i in range(count)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    peer = (me + 1) % n
    inboxes = [torch.empty(2) for _ in range(count // 10)]
    recvs = [dist.irecv(inbox, src=(me - 1) % n) for inbox in inboxes]
    sends = [dist.isend(torch.full((2,), float(me * 1000 + k)), peer) for k in range(len(inboxes))]
    for work in works + recvs + sends:
        work.wait()
    for i, t in enumerate(tensors):
        assert t[0].item() == float(sum(r * count + i for r in range(n))), i
    left = (me - 1) % n
    for k, inbox in enumerate(inboxes):
        assert inbox[0].item() == float(left * 1000 + k), k
    return True


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_thousand_async_ops_in_flight(rank_pools, world_size):
    assert rank_pools(world_size).run(_many_in_flight, 1000) == [True] * world_size


def _teardown_with_work_in_flight(ctx):
    n, me = ctx.world_size, ctx.rank
    threads_then = fds_then = None
    for round_ in range(4):
        if round_ == 1:  # the first round starts what a process starts once (thread pools)
            dist.barrier()
            threads_then, fds_then = threads.count(), fd_count()
        group = dist.new_group(backend="streamnccl")
        works = [
            dist.all_reduce(torch.full((16,), float(me)), group=group, async_op=True)
            for _ in range(100)
        ]
        # Lanes too: a send and a recv with each neighbour, still pending when the group goes.
        inbox = torch.empty(4)
        pending = dist.irecv(inbox, src=(me - 1) % n, group=group)
        dist.isend(torch.ones(4), (me + 1) % n, group=group)
        dist.destroy_process_group(group)
        del works, pending, group  # what the caller still holds goes too
    dist.barrier()
    return threads.count() - threads_then, fd_count() - fds_then


@pytest.mark.parametrize("world_size", [2, 3])
def test_destroying_a_group_with_work_in_flight_leaves_nothing_behind(rank_pools, world_size):
    leftovers = rank_pools(world_size).run(_teardown_with_work_in_flight)
    assert leftovers == [(0, 0)] * world_size, f"(threads, fds) left per rank: {leftovers}"


def test_ranks_exit_cleanly_after_destroying_groups_with_work_in_flight():
    from conftest import BACKEND, TIMEOUT_S
    from rankpool import RankPool

    pool = RankPool(2, BACKEND, TIMEOUT_S)
    try:
        pool.run(_teardown_with_work_in_flight)
    finally:
        exit_codes = pool.close()
    assert exit_codes == [0, 0]
