"""DDP through streamnccl and through Gloo: the same model and data give the same parameters
after 20+ steps, with the default hook, a Python comm hook on get_future().then(),
find_unused_parameters, no_sync() and static_graph."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

pytestmark = pytest.mark.torch_internals  # DDP, which reads a group's backend

STEPS = 24


class TwoBranchNet(nn.Module):
    """The second branch is used only when asked, for find_unused_parameters."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
        self.extra = nn.Linear(4, 4)

    def forward(self, x, use_extra=True):
        y = self.body(x)
        return self.extra(y) if use_extra else y


def allreduce_then_average(group, bucket):
    # A Python comm hook: the average is taken in a then() callback on the op's future.
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    size = dist.get_world_size(group)
    return fut.then(lambda f: f.value()[0].div_(size))


def train(ctx, group, mode):
    torch.manual_seed(1234)  # the same initial weights for both backends
    model = TwoBranchNet()
    ddp = DDP(
        model,
        process_group=group,
        find_unused_parameters=mode == "find_unused",
        static_graph=mode == "static_graph",
    )
    if mode == "python_hook":
        ddp.register_comm_hook(group, allreduce_then_average)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = ctx.seed(42)
    for step in range(STEPS):
        x = torch.randn(16, 8, generator=gen)
        target = torch.randn(16, 4, generator=gen)
        use_extra = not (mode == "find_unused" and step % 3 == 0)
        if mode == "no_sync" and step % 3 != 2:
            with ddp.no_sync():  # accumulate locally, synchronise every third step
                nn.functional.mse_loss(ddp(x, use_extra), target).backward()
            continue
        nn.functional.mse_loss(ddp(x, use_extra), target).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _ddp_parity(ctx, mode):
    with_streamnccl = train(ctx, dist.group.WORLD, mode)
    with_gloo = train(ctx, ctx.gloo, mode)
    for ours, theirs in zip(with_streamnccl, with_gloo, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    # And the ranks agree with each other.
    flat = torch.cat([p.reshape(-1) for p in with_streamnccl])
    everyone = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, flat, group=ctx.gloo)
    assert all(torch.equal(other, everyone[0]) for other in everyone)
    return float(flat.abs().sum())


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize(
    "mode", ["default", "python_hook", "find_unused", "no_sync", "static_graph"]
)
def test_ddp_matches_gloo(rank_pools, world_size, mode):
    checksums = rank_pools(world_size).run(_ddp_parity, mode, timeout=120)
    assert len(set(checksums)) == 1
