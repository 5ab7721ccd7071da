"""The NCCL path across ranks, one GPU per rank, against Gloo on the same random data.
Skipped with a reason where there are fewer GPUs than ranks."""

import pytest
import torch
import torch.distributed as dist

WORLD_SIZE = 2

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < WORLD_SIZE,
    reason=f"needs {WORLD_SIZE} CUDA devices, this machine has {torch.cuda.device_count()}",
)

OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]


def _against_gloo(ctx, async_op):
    n, me = ctx.world_size, ctx.rank
    device = torch.device("cuda", me)
    torch.cuda.set_device(device)

    def finish(work):
        if async_op:
            work.wait()

    for i, op_name in enumerate(OPS):
        x = torch.rand(1000, generator=ctx.seed(i)) + 0.5
        mine = x.to(device)
        finish(dist.all_reduce(mine, op=getattr(dist.ReduceOp, op_name), async_op=async_op))
        expected = x.clone()
        gloo_op = dist.ReduceOp.SUM if op_name == "AVG" else getattr(dist.ReduceOp, op_name)
        dist.all_reduce(expected, op=gloo_op, group=ctx.gloo)
        if op_name == "AVG":
            expected /= n
        assert torch.allclose(mine.cpu(), expected, rtol=1e-5), op_name

    x = torch.rand(6, 5, generator=ctx.seed(10))
    gathered = torch.empty(6 * n, 5, device=device)
    finish(dist.all_gather_into_tensor(gathered, x.to(device), async_op=async_op))
    expected = torch.empty(6 * n, 5)
    dist.all_gather_into_tensor(expected, x, group=ctx.gloo)
    assert torch.equal(gathered.cpu(), expected)

    x = torch.rand(4 * n, generator=ctx.seed(11))
    scattered = torch.empty(4, device=device)
    finish(dist.reduce_scatter_tensor(scattered, x.to(device), async_op=async_op))
    expected = x.clone()
    dist.all_reduce(expected, group=ctx.gloo)
    assert torch.allclose(scattered.cpu(), expected[4 * me : 4 * me + 4], rtol=1e-5)

    x = torch.rand(7, generator=ctx.seed(12)).to(device)
    finish(dist.broadcast(x, src=n - 1, async_op=async_op))
    expected = torch.rand(7, generator=torch.Generator().manual_seed(1_000_003 * 12 + n - 1))
    assert torch.equal(x.cpu(), expected)

    # Around a ring with every recv posted first: the lanes keep them apart.
    inbox = torch.empty(1 << 20, device=device)
    pending = dist.irecv(inbox, src=(me - 1) % n)
    dist.send(torch.full((1 << 20,), float(me), device=device), dst=(me + 1) % n)
    pending.wait()
    assert torch.equal(inbox.cpu(), torch.full((1 << 20,), float((me - 1) % n)))
    return True


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_nccl_path_matches_gloo(rank_pools, async_op):
    assert rank_pools(WORLD_SIZE).run(_against_gloo, async_op) == [True] * WORLD_SIZE
