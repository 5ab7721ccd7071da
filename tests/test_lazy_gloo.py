"""The host path opens Gloo at a group's first CPU op, not with the group: groups used only for
CUDA tensors, or not at all, hold none of Gloo's sockets and threads."""

import os
from datetime import timedelta

import pytest
import streamnccl
import threads
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

pytestmark = (
    pytest.mark.torch_internals
)  # torch's ProcessGroupGloo options, which the host path makes

GROUPS = 64


def _sockets():
    """This process's open sockets."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # closed meanwhile
            pass
    return count


def _unused_groups_then_one_op(ctx):
    before = (_sockets(), threads.count())
    groups = [dist.new_group(backend="streamnccl") for _ in range(GROUPS)]
    made = (_sockets(), threads.count())
    x = torch.full((3,), float(ctx.rank))
    dist.all_reduce(x, group=groups[-1])
    assert torch.equal(x, torch.full((3,), float(sum(range(ctx.world_size)))))
    used = (_sockets(), threads.count())
    for group in groups:
        dist.destroy_process_group(group)
    return before, made, used


@pytest.mark.parametrize("world_size", [2])
def test_unused_groups_open_no_gloo_and_a_cpu_op_on_one_still_works(rank_pools, world_size):
    for (sockets, threads_then), (made_sockets, made_threads), (used_sockets, _) in rank_pools(
        world_size
    ).run(_unused_groups_then_one_op):
        assert made_sockets == sockets, "groups never used opened sockets"
        # Each group's watchdog (and slack); Gloo would add its device loop and worker each.
        assert made_threads - threads_then < 2 * GROUPS, (threads_then, made_threads)
        assert used_sockets > made_sockets, "the first CPU op opened no Gloo (nothing measured)"


def _first_cpu_op_a_send_while_one_member_makes_none(ctx):
    # Ranks 0 and 1 exchange on a group of three whose rank 2 makes no CPU op on it: Gloo opened
    # with a full mesh at the first op would wait for rank 2 until the timeout.
    group = dist.new_group(backend="streamnccl")
    if ctx.rank == 0:
        dist.send(torch.full((3,), 7.0), dst=1, group=group)
    elif ctx.rank == 1:
        inbox = torch.zeros(3)
        dist.recv(inbox, src=0, group=group)
        assert torch.equal(inbox, torch.full((3,), 7.0))
    dist.barrier()
    dist.destroy_process_group(group)


@pytest.mark.parametrize("world_size", [3])
def test_a_first_send_waits_only_for_its_peer(rank_pools, world_size):
    rank_pools(world_size).run(_first_cpu_op_a_send_while_one_member_makes_none, timeout=30)


def _a_lane_waits_for_its_own_peer_alone(ctx):
    # Rank 0's send to rank 2, whose first CPU op on the group comes late (after a world op
    # that needs rank 0), must not hold up rank 0's recv from rank 1: with Gloo's address wait
    # inside Gloo (under its context's lock) the three would wait for each other until the
    # timeout. With the group's Gloo made with the group, it never waited.
    group = dist.new_group(backend="streamnccl")
    world = torch.ones(2)
    if ctx.rank == 0:
        pending = dist.isend(torch.full((2,), 5.0), dst=2, group=group)
        inbox = torch.zeros(2)
        dist.recv(inbox, src=1, group=group)
        dist.all_reduce(world)
        pending.wait()
        received = inbox
    elif ctx.rank == 1:
        dist.send(torch.full((2,), 3.0), dst=0, group=group)
        dist.all_reduce(world)
        received = None
    else:
        dist.all_reduce(world)
        received = torch.zeros(2)
        dist.recv(received, src=0, group=group)
    dist.destroy_process_group(group)
    return None if received is None else received.tolist()


@pytest.mark.parametrize("world_size", [3])
def test_a_first_send_to_a_late_peer_holds_up_no_other_exchange(rank_pools, world_size):
    results = rank_pools(world_size).run(_a_lane_waits_for_its_own_peer_alone, timeout=30)
    assert results == [[3.0, 3.0], None, [5.0, 5.0]]


def _a_batch_posts_each_call_once_its_own_peer_is_there(ctx):
    # As above, inside one batch_isend_irecv: the recv from rank 1 must not wait behind the
    # send to rank 2 (Gloo's send waits for the matching recv, so rank 1 would never finish).
    group = dist.new_group(backend="streamnccl")
    world = torch.ones(2)
    if ctx.rank == 0:
        inbox = torch.zeros(2)
        works = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, torch.full((2,), 5.0), 2, group),
                dist.P2POp(dist.irecv, inbox, 1, group),
            ]
        )
        dist.all_reduce(world)
        for work in works:
            work.wait()
        received = inbox
    elif ctx.rank == 1:
        # Batched too: a batch runs on the group's stream, apart from the lanes of plain sends.
        for work in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, torch.full((2,), 3.0), 0, group)]
        ):
            work.wait()
        dist.all_reduce(world)
        received = None
    else:
        dist.all_reduce(world)
        received = torch.zeros(2)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, received, 0, group)]):
            work.wait()
    dist.destroy_process_group(group)
    return None if received is None else received.tolist()


@pytest.mark.parametrize("world_size", [3])
def test_a_batch_posts_each_call_once_its_own_peer_is_there(rank_pools, world_size):
    results = rank_pools(world_size).run(
        _a_batch_posts_each_call_once_its_own_peer_is_there, timeout=30
    )
    assert results == [[3.0, 3.0], None, [5.0, 5.0]]


def _a_collective_waiting_for_a_late_member_holds_up_no_lane(ctx):
    # The same for an async collective: it waits for rank 2 on the group's stream, and rank
    # 0's recv from rank 1 goes on meanwhile.
    group = dist.new_group(backend="streamnccl")
    world = torch.ones(2)
    total = torch.full((2,), float(ctx.rank))
    if ctx.rank == 0:
        pending = dist.all_reduce(total, group=group, async_op=True)
        inbox = torch.zeros(2)
        dist.recv(inbox, src=1, group=group)
        dist.all_reduce(world)
        pending.wait()
    elif ctx.rank == 1:
        dist.send(torch.full((2,), 3.0), dst=0, group=group)
        dist.all_reduce(world)
        dist.all_reduce(total, group=group)
    else:
        dist.all_reduce(world)
        dist.all_reduce(total, group=group)
    dist.destroy_process_group(group)
    return total.tolist()


@pytest.mark.parametrize("world_size", [3])
def test_a_collective_waiting_for_a_late_member_holds_up_no_lane(rank_pools, world_size):
    results = rank_pools(world_size).run(
        _a_collective_waiting_for_a_late_member_holds_up_no_lane, timeout=30
    )
    assert results == [[3.0, 3.0]] * 3


def test_gloo_that_cannot_be_opened_fails_the_first_cpu_op_clearly():
    def no_network(store, rank, size, timeout):
        raise RuntimeError("no network here")

    store = dist.HashStore()
    timeout = timedelta(seconds=10)
    group = streamnccl.ProcessGroup(
        store, 0, 1, timeout, streamnccl.Options(), open_gloo=no_network
    )
    options = AllreduceOptions()
    with pytest.raises(
        dist.DistBackendError,
        match=r"allreduce: connecting cpu failed: .*opening Gloo for the host path failed: "
        r".*no network here",
    ):
        group.allreduce([torch.ones(2)], options)
    # The group broke, as at a failed NCCL init: later ops say so rather than try again.
    with pytest.raises(dist.DistBackendError, match="no network here"):
        group.allreduce([torch.ones(2)], options)
    group.shutdown()
