"""send/recv, isend/irecv with tags, batch_isend_irecv as one group, and the coalescing
manager (all_reduce, all_gather_into_tensor, reduce_scatter_tensor) as one Work."""

import pytest
import torch
import torch.distributed as dist

WORLD_SIZES = [2, 3, 4]


def _send_recv_ring(ctx):
    n, me = ctx.world_size, ctx.rank
    right, left = (me + 1) % n, (me - 1) % n
    # Blocking, ordered so that it cannot deadlock: even ranks send first.
    out, inbox = torch.full((3, 2), float(me)), torch.empty(3, 2)
    if me % 2 == 0:
        dist.send(out, dst=right, tag=7)
        dist.recv(inbox, src=left, tag=7)
    else:
        dist.recv(inbox, src=left, tag=7)
        dist.send(out, dst=right, tag=7)
    assert torch.equal(inbox, torch.full((3, 2), float(left)))
    # Non-blocking, into a non-contiguous receive buffer. Ops of a group run in program
    # order on one stream (as NCCL ops on one communicator do), so a recv posted before the
    # matching send would block it: even ranks send first. For any order, batch_isend_irecv.
    inbox_t = torch.empty(2, 3).t()
    message = torch.full((3, 2), float(me) + 0.5)
    if me % 2 == 0:
        works = [dist.isend(message, dst=right, tag=1), dist.irecv(inbox_t, src=left, tag=1)]
    else:
        works = [dist.irecv(inbox_t, src=left, tag=1), dist.isend(message, dst=right, tag=1)]
    for work in works:
        work.wait()
    assert torch.equal(inbox_t, torch.full((3, 2), float(left) + 0.5))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_send_recv_around_a_ring(rank_pools, world_size):
    rank_pools(world_size).run(_send_recv_ring)


def _batch_isend_irecv(ctx):
    n, me = ctx.world_size, ctx.rank
    ops, inboxes = [], {}
    for peer in range(n):
        if peer == me:
            continue
        inboxes[peer] = torch.empty(4, dtype=torch.int64)
        ops.append(dist.P2POp(dist.isend, torch.full((4,), 10 * me + peer), peer))
        ops.append(dist.P2POp(dist.irecv, inboxes[peer], peer))
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 1, "one group, one Work"
    for work in works:
        work.wait()
    for peer, inbox in inboxes.items():
        assert torch.equal(inbox, torch.full((4,), 10 * peer + me))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_batch_isend_irecv_is_one_group(rank_pools, world_size):
    rank_pools(world_size).run(_batch_isend_irecv)


def _coalescing_manager(ctx, async_ops):
    from torch.distributed.distributed_c10d import _coalescing_manager

    n, me = ctx.world_size, ctx.rank
    cpu = torch.device("cpu")
    tensors = [torch.full((k + 1,), float(me + k)) for k in range(3)]
    with _coalescing_manager(device=cpu, async_ops=async_ops) as cm:
        for t in tensors:
            dist.all_reduce(t)
    if async_ops:
        cm.wait()
    for k, t in enumerate(tensors):
        assert torch.equal(t, torch.full((k + 1,), float(sum(r + k for r in range(n)))))

    inputs = [torch.full((2,), float(me * 10 + k)) for k in range(2)]
    outputs = [torch.empty(2 * n) for _ in range(2)]
    with _coalescing_manager(device=cpu, async_ops=async_ops) as cm:
        for out, inp in zip(outputs, inputs, strict=True):
            dist.all_gather_into_tensor(out, inp)
    if async_ops:
        cm.wait()
    for k, out in enumerate(outputs):
        expected = torch.tensor([float(r * 10 + k) for r in range(n) for _ in range(2)])
        assert torch.equal(out, expected)

    sources = [torch.arange(2.0 * n) + me for _ in range(2)]
    results = [torch.empty(2) for _ in range(2)]
    with _coalescing_manager(device=cpu, async_ops=async_ops) as cm:
        for out, src in zip(results, sources, strict=True):
            dist.reduce_scatter_tensor(out, src)
    if async_ops:
        cm.wait()
    offset = float(sum(range(n)))
    for out in results:
        expected = torch.arange(2.0 * me, 2.0 * me + 2) * n + offset
        assert torch.equal(out, expected)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("async_ops", [False, True], ids=["sync", "async"])
def test_coalescing_manager_runs_one_group(rank_pools, world_size, async_ops):
    rank_pools(world_size).run(_coalescing_manager, async_ops)


def _all_reduce_coalesced(ctx):
    n, me = ctx.world_size, ctx.rank
    tensors = [torch.full((3,), float(me)), torch.full((2, 2), float(me) * 2)]
    work = dist.distributed_c10d._get_default_group().allreduce_coalesced(tensors)
    work.wait()
    total = float(sum(range(n)))
    assert torch.equal(tensors[0], torch.full((3,), total))
    assert torch.equal(tensors[1], torch.full((2, 2), 2 * total))


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduce_coalesced(rank_pools, world_size):
    rank_pools(world_size).run(_all_reduce_coalesced)
