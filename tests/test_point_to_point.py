"""send/recv, isend/irecv with tags, recv from any source, batch_isend_irecv as one group, and
the coalescing manager (all_reduce, all_gather_into_tensor, reduce_scatter_tensor) as one Work."""

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
    # Non-blocking, into a non-contiguous receive buffer, every rank posting its recv first:
    # sends to a peer and recvs from it run on separate lanes, so neither waits for the other.
    inbox_t = torch.empty(2, 3).t()
    message = torch.full((3, 2), float(me) + 0.5)
    pending = dist.irecv(inbox_t, src=left, tag=1)
    dist.send(message, dst=right, tag=1)
    pending.wait()
    assert torch.equal(inbox_t, torch.full((3, 2), float(left) + 0.5))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_send_recv_around_a_ring(rank_pools, world_size):
    rank_pools(world_size).run(_send_recv_ring)


def _exchange_in_any_order(ctx, numel):
    # Each rank swaps a message with every other rank, recvs posted before sends, and with
    # messages large enough that no transport could buffer a send whole.
    n, me = ctx.world_size, ctx.rank
    inboxes = {peer: torch.empty(numel, dtype=torch.int32) for peer in range(n) if peer != me}
    recvs = [dist.irecv(inbox, src=peer) for peer, inbox in inboxes.items()]
    sends = [dist.isend(torch.full((numel,), 100 * me + p, dtype=torch.int32), p) for p in inboxes]
    for work in recvs + sends:
        work.wait()
    for peer, inbox in inboxes.items():
        assert torch.equal(inbox, torch.full((numel,), 100 * peer + me, dtype=torch.int32))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("numel", [5, 1 << 21], ids=["small", "8MiB"])
def test_recvs_posted_before_sends_do_not_block_them(rank_pools, world_size, numel):
    rank_pools(world_size).run(_exchange_in_any_order, numel)


def _messages_keep_their_order_beside_collectives(ctx):
    # Rank 1 sends rank 0 a run of messages, after a collective that rank 0 joins only once
    # its recvs are posted: a pending recv does not hold up the group's collectives, and the
    # messages arrive in the order they were sent.
    me = ctx.rank
    total = torch.full((2,), float(me))
    if me == 0:
        inboxes = [torch.empty(3) for _ in range(4)]
        recvs = [dist.irecv(inbox, src=1) for inbox in inboxes]
        dist.all_reduce(total)
        for work in recvs:
            work.wait()
        for k, inbox in enumerate(inboxes):
            assert torch.equal(inbox, torch.full((3,), float(k)))
    else:
        dist.all_reduce(total)
        if me == 1:
            sends = [dist.isend(torch.full((3,), float(k)), dst=0) for k in range(4)]
            for work in sends:
                work.wait()
    assert torch.equal(total, torch.full((2,), float(sum(range(ctx.world_size)))))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_messages_keep_their_order_beside_collectives(rank_pools, world_size):
    rank_pools(world_size).run(_messages_keep_their_order_beside_collectives)


def _ops_that_end_behind_a_pending_recv_are_let_go(ctx):
    # An op that has ended is let go of (its Work and the tensors it held) at the next call
    # on its group, though a recv posted before it, on a lane, still waits for its peer: ops
    # end in order on each stream, not across the group's streams.
    group = dist.new_group([0, 1], backend="streamnccl")
    if ctx.rank > 1:
        return
    inbox = torch.empty(3)
    recv = dist.irecv(inbox, src=1, group=group) if ctx.rank == 0 else None
    y = torch.ones(4)
    work = dist.all_reduce(y, group=group, async_op=True)
    work.wait()
    del work
    x = torch.ones(4)
    dist.all_reduce(x, group=group)  # its launch looks past the recv, still pending on rank 0
    if ctx.rank == 0:
        assert not recv.is_completed()
        assert y._use_count() == 1, "the group still holds the op that ended behind the recv"
    dist.all_reduce(torch.ones(1), group=group)  # rank 0 has looked: rank 1 sends only now
    if ctx.rank == 0:
        recv.wait()
        assert torch.equal(inbox, torch.full((3,), 5.0))
    else:
        dist.send(torch.full((3,), 5.0), dst=0, group=group)
    assert torch.equal(x, torch.full((4,), 2.0)) and torch.equal(y, torch.full((4,), 2.0))
    dist.destroy_process_group(group)


def test_ops_that_end_behind_a_pending_recv_are_let_go(rank_pools):
    rank_pools(2).run(_ops_that_end_behind_a_pending_recv_are_let_go)


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


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_coalesced(rank_pools, world_size):
    rank_pools(world_size).run(_all_reduce_coalesced)


def _recv_from_any_source(ctx):
    # Every rank but the last sends it two messages; it receives them without naming the
    # sender, half with recv and half with irecv. Each message carries its sender's rank
    # (+0.5 for the second), whichever order they arrive in, and a sender's two arrive in the
    # order they were sent.
    n, me = ctx.world_size, ctx.rank
    receiver = n - 1
    if me != receiver:
        dist.send(torch.full((2, 3), float(me)), dst=receiver)
        dist.send(torch.full((2, 3), float(me) + 0.5), dst=receiver)
        return
    received = []  # (sender, value)
    for i in range(2 * (n - 1)):
        inbox = torch.empty(2, 3)
        if i % 2 == 0:
            sender = dist.recv(inbox)
        else:
            work = dist.irecv(inbox)
            work.wait()
            sender = work._source_rank()
        assert torch.equal(inbox, torch.full((2, 3), inbox[0, 0].item()))
        received.append((sender, inbox[0, 0].item()))
    for sender in range(n - 1):
        assert [value for s, value in received if s == sender] == [sender, sender + 0.5]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_recv_from_any_source(rank_pools, world_size):
    rank_pools(world_size).run(_recv_from_any_source)


def _pending_any_source_recv_beside_a_collective(ctx):
    # Rank 0 posts a recv from any source, then every rank joins an all_reduce; only after it
    # does rank 1 send. The pending recv must not hold up the collective.
    n, me = ctx.world_size, ctx.rank
    inbox = torch.empty(4)
    pending = dist.irecv(inbox) if me == 0 else None
    x = torch.ones(3)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((3,), float(n)))
    if me == 1:
        dist.send(torch.arange(4.0), dst=0)
    if me == 0:
        pending.wait()
        assert pending._source_rank() == 1
        assert torch.equal(inbox, torch.arange(4.0))
    # A recv from a named peer has no sender to report. (After a barrier: a message sent
    # while rank 0's recv from any source is pending could be the one it takes.)
    dist.barrier()
    named = dist.irecv(torch.empty(1), src=(me - 1) % n)
    dist.send(torch.ones(1), dst=(me + 1) % n)
    named.wait()
    with pytest.raises(ValueError, match=r"sourceRank\(\) names the sender of a recv from any"):
        named._source_rank()


@pytest.mark.parametrize("world_size", [2, 3])
def test_pending_any_source_recv_does_not_hold_up_collectives(rank_pools, world_size):
    rank_pools(world_size).run(_pending_any_source_recv_beside_a_collective)


def _async_collective_then_a_message_its_peer_needs_first(ctx):
    # Rank 0 issues an async all_reduce, then sends rank 1 a message; rank 1 receives it before
    # it joins the all_reduce. Issuing an async op must not hold its caller until the op is
    # done: rank 0 would never send, and both ranks would wait for ever (the pool's timeout).
    n, me = ctx.world_size, ctx.rank
    x = torch.full((4,), float(me))
    if me == 0:
        reduced = dist.all_reduce(x, async_op=True)
        dist.send(torch.arange(3.0), dst=1)
        reduced.wait()
    else:
        if me == 1:
            inbox = torch.empty(3)
            dist.recv(inbox, src=0)
            assert torch.equal(inbox, torch.arange(3.0))
        dist.all_reduce(x)
    assert torch.equal(x, torch.full((4,), float(sum(range(n)))))


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_async_collective_does_not_hold_its_caller_for_a_peer_that_comes_later(
    rank_pools, world_size
):
    rank_pools(world_size).run(_async_collective_then_a_message_its_peer_needs_first)


def _messages_never_waited_for(ctx):
    # Neither side ever calls wait(): each op still completes, is_completed() says so, and the
    # message arrives. Whoever observes a send's or a recv's end, it must not be a wait() that
    # may never come.
    import time

    me = ctx.rank
    if me == 0:
        work = dist.isend(torch.full((5,), 7.0), dst=1)
    elif me == 1:
        inbox = torch.empty(5)
        work = dist.irecv(inbox, src=0)
    if me < 2:
        deadline = time.monotonic() + 30
        while not work.is_completed():
            assert time.monotonic() < deadline, "never completed without a wait()"
            time.sleep(0.001)
        assert work.is_success()
    if me == 1:
        assert torch.equal(inbox, torch.full((5,), 7.0))
    dist.barrier()


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_send_and_a_recv_never_waited_for_complete(rank_pools, world_size):
    rank_pools(world_size).run(_messages_never_waited_for)
