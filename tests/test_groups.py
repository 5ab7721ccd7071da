"""Subgroups through new_group and split, and the mixed backend strings "cpu:gloo,cuda:streamnccl"
and "cpu:streamnccl,cuda:streamnccl"."""

import copy
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
import streamnccl
import torch
import torch.distributed as dist
from test_examples import torchrun

pytestmark = pytest.mark.torch_internals  # torch's new_group, split_group and backend strings

JOBS = Path(__file__).resolve().parent / "jobs"


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


def _split(ctx):
    # torch's split_group needs a GPU-bound default group; the split itself is the c10d
    # ProcessGroup's, which asks our backend once per device type it serves.
    n, me = ctx.world_size, ctx.rank
    world = dist.distributed_c10d._get_default_group()
    half = n // 2
    mine = list(range(half)) if me < half else list(range(half, n))
    parent = world._get_backend(torch.device("cpu"))
    parent_name = parent.streamnccl_options.group_name
    part = world.split_group(mine, timeout=timedelta(seconds=30), group_name=f"part{mine[0]}")
    # torch names the subgroup in the options it asks the parent for: a copy, not the parent's
    # own, which would then carry the subgroup's name and timeout.
    assert parent.streamnccl_options.group_name == parent_name
    # dist.split_group without pg_options deep-copies the parent's.
    copied = copy.deepcopy(parent.options)
    assert isinstance(copied, streamnccl.Options) and copied is not parent.streamnccl_options
    assert copied.group_name == parent_name
    backend = part._get_backend(torch.device("cpu"))
    assert isinstance(backend, streamnccl.ProcessGroup)
    assert backend is part._get_backend(torch.device("cuda")), "one backend for both types"
    assert (part.rank(), part.size()) == (mine.index(me), len(mine))

    x = torch.full((3,), float(me))
    part.allreduce([x]).wait()
    assert torch.equal(x, torch.full((3,), float(sum(mine))))
    gathered = [torch.empty(2) for _ in mine]
    part.allgather([gathered], [torch.full((2,), float(me))]).wait()
    assert [g[0].item() for g in gathered] == [float(r) for r in mine]
    # Point-to-point between the subgroup's ranks 0 and 1, recv posted first.
    inbox = torch.empty(4)
    peer = 1 - part.rank()
    pending = part.recv([inbox], peer, 0)
    part.send([torch.full((4,), float(me))], peer, 0).wait()
    pending.wait()
    assert torch.equal(inbox, torch.full((4,), float(mine[peer])))

    # A rank asked to split into a group without it gets none.
    assert world.split_group([r for r in range(n) if r != me], group_name=f"without{me}") is None
    z = torch.ones(1)
    dist.all_reduce(z)  # the world group is unaffected
    assert z.item() == n


@pytest.mark.parametrize("world_size", [4])
def test_split_group_gives_each_part_its_own_paths(rank_pools, world_size):
    rank_pools(world_size).run(_split)


def _split_with_debug_checks(ctx):
    # A split group's debug checks meet through the store c10d hands the split: a matched
    # collective runs, a mismatched one is named.
    n, me = ctx.world_size, ctx.rank
    world = dist.distributed_c10d._get_default_group()
    part = world.split_group(
        list(range(n)),
        timeout=timedelta(seconds=30),
        opts=streamnccl.Options(debug_checks=True),
        group_name="checked",
    )
    x = torch.full((3,), float(me))
    part.allreduce([x]).wait()
    assert torch.equal(x, torch.full((3,), float(sum(range(n)))))
    with pytest.raises(dist.DistBackendError, match="debug check failed"):
        if me == 0:
            part.allreduce([torch.ones(3)]).wait()
        else:
            part.broadcast([torch.ones(3)]).wait()
    return True


@pytest.mark.parametrize("world_size", [2])
def test_debug_checks_work_on_split_groups(rank_pools, world_size):
    assert rank_pools(world_size).run(_split_with_debug_checks) == [True] * world_size


@pytest.mark.slow
def test_new_group_on_a_bound_default_group_splits_it_as_torch_decides(tmp_path):
    # torch's own new_group (its making of the group, whose locals streamnccl reads): the
    # members split the default group and the rank outside takes part; a group of another
    # backend, or one made with use_local_synchronization, splits nothing.
    done = torchrun(JOBS / "new_group_split.py", 3, timeout_s=180, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    made = {r: json.loads((tmp_path / f"splits_rank_{r}.json").read_text()) for r in range(3)}
    (agreement,) = {made[rank]["last_two"][0][1] for rank in range(3)}
    assert re.fullmatch(r"new_group/\d+", agreement), agreement
    assert made[0]["last_two"] == [["split_without", agreement]]
    assert made[1]["last_two"] == made[2]["last_two"] == [["split", agreement]]
    for rank in range(3):
        assert made[rank]["gloo"] == made[rank]["local_sync"] == [], made
