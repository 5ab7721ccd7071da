"""The clients people train with today, on streamnccl's host path, each checked against gloo or a
closed form: functional collectives, the same under torch.compile, DTensor, and FSDP2. They
reach the backend through torch's own layers (the c10d functional ops, the group registry by
name, DeviceMesh), which change from one torch release to the next."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

pytestmark = pytest.mark.torch_internals
WORLD_SIZES = [2, 3]


def _functional_collectives(ctx):
    n, me = ctx.world_size, ctx.rank
    world = dist.group.WORLD
    x = torch.arange(4, dtype=torch.float32) + me
    summed = funcol.wait_tensor(funcol.all_reduce(x, "sum", world))
    assert torch.equal(summed, n * torch.arange(4, dtype=torch.float32) + sum(range(n)))
    assert torch.equal(x, torch.arange(4, dtype=torch.float32) + me)  # functional: not in place
    gathered = funcol.wait_tensor(funcol.all_gather_tensor(torch.full((2,), float(me)), 0, world))
    assert gathered.tolist() == [float(r) for r in range(n) for _ in range(2)]
    scattered = funcol.wait_tensor(
        funcol.reduce_scatter_tensor(torch.arange(2 * n, dtype=torch.float32), "sum", 0, world)
    )
    assert scattered.tolist() == [float(n * (2 * me)), float(n * (2 * me + 1))]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_functional_collectives(rank_pools, world_size):
    rank_pools(world_size).run(_functional_collectives)


def _compiled_functional_all_reduce(ctx):
    world = dist.group.WORLD

    def step(x):
        return funcol.all_reduce(x * 2, "sum", world) + 1

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.full((3,), float(ctx.rank))
    expected = step(x.clone())
    got = compiled(x)
    assert torch.equal(got, expected), (got, expected)
    assert torch.equal(got, torch.full((3,), 2.0 * sum(range(ctx.world_size)) + 1))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2])
def test_functional_collectives_under_torch_compile(rank_pools, world_size):
    # Traced by dynamo and AOTAutograd in one graph (fullgraph), then run on streamnccl.
    rank_pools(world_size).run(_compiled_functional_all_reduce)


def _dtensor(ctx):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    n, me = ctx.world_size, ctx.rank
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    full = torch.arange(4 * n * 3, dtype=torch.float32).reshape(4 * n, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.to_local(), full[4 * me : 4 * (me + 1)])
    assert torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), full)  # all_gather
    partial = DTensor.from_local(torch.full((2, 2), float(me + 1)), mesh, [Partial()])
    total = float(sum(range(1, n + 1)))
    assert torch.equal(
        partial.redistribute(mesh, [Replicate()]).to_local(), torch.full((2, 2), total)
    )
    ones = distribute_tensor(torch.ones(3, 1), mesh, [Replicate()])
    product = (sharded @ ones).redistribute(mesh, [Replicate()]).to_local()
    assert torch.equal(product, full @ torch.ones(3, 1))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_dtensor(rank_pools, world_size):
    rank_pools(world_size).run(_dtensor)


def _fsdp2_parameters_after_steps(ctx, group):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = ctx.seed(11)
    for _ in range(3):
        model(torch.randn(4, 8, generator=data)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.full_tensor() for p in model.parameters()]


def _fsdp2_matches_gloo(ctx):
    ours = _fsdp2_parameters_after_steps(ctx, dist.group.WORLD)
    theirs = _fsdp2_parameters_after_steps(ctx, ctx.gloo)
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("world_size", [2])
def test_fsdp2_training_matches_gloo(rank_pools, world_size):
    rank_pools(world_size).run(_fsdp2_matches_gloo)
