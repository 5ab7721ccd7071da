"""Subgroups through new_group, and the mixed backend strings "cpu:gloo,cuda:streamnccl"
and "cpu:streamnccl,cuda:streamnccl"."""

import pytest
import streamnccl
import torch
import torch.distributed as dist


def _subgroups(ctx):
    n, me = ctx.world_size, ctx.rank
    # Every group creation is collective over the whole world, members or not.
    evens = dist.new_group(ranks=list(range(0, n, 2)), backend="streamnccl")
    last_two = dist.new_group(ranks=[n - 2, n - 1])  # the default backend: streamnccl
    if me % 2 == 0:
        x = torch.full((3,), float(me))
        dist.all_reduce(x, group=evens)
        assert torch.equal(x, torch.full((3,), float(sum(range(0, n, 2)))))
        assert dist.get_rank(evens) == me // 2
    else:
        assert evens == dist.GroupMember.NON_GROUP_MEMBER
    if me >= n - 2:
        y = torch.full((2,), float(me))
        dist.broadcast(y, src=n - 1, group=last_two)  # src is a global rank
        assert torch.equal(y, torch.full((2,), float(n - 1)))
        backend = last_two._get_backend(torch.device("cpu"))
        assert isinstance(backend, streamnccl.ProcessGroup)
        assert backend.size() == 2
    # The world group is unaffected.
    z = torch.ones(1)
    dist.all_reduce(z)
    assert z.item() == n


@pytest.mark.parametrize("world_size", [3, 4])
def test_subgroups(rank_pools, world_size):
    rank_pools(world_size).run(_subgroups)


def _mixed_backend_strings(ctx):
    n = ctx.world_size
    both = dist.new_group(backend="cpu:streamnccl,cuda:streamnccl")
    assert isinstance(both._get_backend(torch.device("cpu")), streamnccl.ProcessGroup)
    assert isinstance(both._get_backend(torch.device("cuda")), streamnccl.ProcessGroup)
    x = torch.ones(4)
    dist.all_reduce(x, group=both)
    assert torch.equal(x, torch.full((4,), float(n)))

    split = dist.new_group(backend="cpu:gloo,cuda:streamnccl")
    assert not isinstance(split._get_backend(torch.device("cpu")), streamnccl.ProcessGroup)
    assert isinstance(split._get_backend(torch.device("cuda")), streamnccl.ProcessGroup)
    y = torch.ones(2)
    dist.all_reduce(y, group=split)  # CPU tensors take the Gloo backend of this group
    assert torch.equal(y, torch.full((2,), float(n)))


@pytest.mark.parametrize("world_size", [2])
def test_mixed_backend_strings(rank_pools, world_size):
    rank_pools(world_size).run(_mixed_backend_strings)
