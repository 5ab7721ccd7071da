"""reduce, reduce_scatter (list and tensor forms), PREMUL_SUM and reductions over the dtypes
NCCL users train in, sync and async, against Gloo on random per-rank data and closed forms."""

import pytest
import torch
import torch.distributed as dist
from collective_helpers import MODES, run_op

WORLD_SIZES = [2, 3, 4]


def rand(ctx, i, shape, dtype=torch.float32):
    return torch.randn(shape, generator=ctx.seed(i)).to(dtype)


# ---- reduce ---------------------------------------------------------------------------------


def _reduce(ctx, mode, op_name):
    op = getattr(dist.ReduceOp, op_name)
    for root in range(ctx.world_size):
        x = rand(ctx, root, (37,), torch.float64)
        expected = x.clone()
        dist.reduce(expected, dst=root, op=dist.ReduceOp.SUM if op_name == "AVG" else op,
                    group=ctx.gloo)  # fmt: skip
        if op_name == "AVG":
            expected /= ctx.world_size
        actual = x.clone()
        run_op(lambda a, t=actual, r=root: dist.reduce(t, dst=r, op=op, async_op=a), mode)
        if ctx.rank == root:
            torch.testing.assert_close(actual, expected)
        else:
            assert torch.equal(actual, x), "only the root's tensor receives the result"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", ["SUM", "AVG", "MAX", "MIN", "PRODUCT"])
def test_reduce_to_every_root(rank_pools, world_size, mode, op_name):
    rank_pools(world_size).run(_reduce, mode, op_name)


def _reduce_changing_sizes_and_grouped(ctx, mode):
    # A non-root rank reduces a copy of its input, in a buffer its group keeps for the next
    # reduce: each op, smaller or larger than the last, of another dtype, or in flight with
    # another in one coalesced group, must reduce its own data and leave the input alone.
    cases = [(300, torch.float64), (5, torch.float32), (7, torch.int32), (600, torch.float32)]
    for i, (count, dtype) in enumerate(cases):
        x = (rand(ctx, 50 + i, (count,), torch.float64) * 10).to(dtype)
        expected = x.clone()
        dist.reduce(expected, dst=0, group=ctx.gloo)
        actual = x.clone()
        run_op(lambda a, t=actual: dist.reduce(t, dst=0, async_op=a), mode)
        if ctx.rank == 0:
            torch.testing.assert_close(actual, expected)
        else:
            assert torch.equal(actual, x)
    first, second = rand(ctx, 60, (64,)), rand(ctx, 61, (64,))
    expected = [first.clone(), second.clone()]
    for tensor in expected:
        dist.reduce(tensor, dst=1, group=ctx.gloo)
    actual = [first.clone(), second.clone()]
    with dist._coalescing_manager(async_ops=True) as coalesced:
        for tensor in actual:
            dist.reduce(tensor, dst=1)
    coalesced.wait()
    for got, want, original in zip(actual, expected, (first, second), strict=True):
        if ctx.rank == 1:
            torch.testing.assert_close(got, want)
        else:
            assert torch.equal(got, original)


@pytest.mark.parametrize("mode", MODES)
def test_reduce_of_changing_sizes_and_in_a_group(rank_pools, mode):
    rank_pools(3).run(_reduce_changing_sizes_and_grouped, mode)


# ---- reduce_scatter -------------------------------------------------------------------------


def _reduce_scatter(ctx, mode, op_name, dtype):
    n = ctx.world_size
    op = getattr(dist.ReduceOp, op_name)
    chunks = [rand(ctx, 10 + j, (5, 3), dtype) for j in range(n)]
    # Reference: every rank's chunk j summed (or maxed...) over ranks, by a Gloo all_reduce.
    stacked = torch.stack(chunks)
    reference = stacked.clone()
    gloo_op = dist.ReduceOp.SUM if op_name == "AVG" else op
    dist.all_reduce(reference, op=gloo_op, group=ctx.gloo)
    if op_name == "AVG":
        reference /= n
    expected = reference[ctx.rank]

    out = torch.full((5, 3), -1.0, dtype=dtype)
    run_op(lambda a: dist.reduce_scatter(out, chunks, op=op, async_op=a), mode)
    torch.testing.assert_close(out, expected)

    out_t = torch.full((5, 3), -1.0, dtype=dtype)
    flat_in = stacked.reshape(n * 5, 3)
    run_op(lambda a: dist.reduce_scatter_tensor(out_t, flat_in, op=op, async_op=a), mode)
    torch.testing.assert_close(out_t, expected)
    assert torch.equal(flat_in, stacked.reshape(n * 5, 3)), "the input must not be modified"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", ["SUM", "AVG", "MAX", "MIN"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_reduce_scatter_list_and_tensor(rank_pools, world_size, mode, op_name, dtype):
    rank_pools(world_size).run(_reduce_scatter, mode, op_name, dtype)


# ---- PREMUL_SUM -----------------------------------------------------------------------------


def _premul_sum(ctx, mode):
    n, r = ctx.world_size, ctx.rank
    for factor in (0.5, torch.tensor([3.0])):
        scale = float(factor) if isinstance(factor, float) else factor.item()
        x = torch.full((6,), float(r + 1))
        run_op(lambda a, t=x, f=factor: dist.all_reduce(
            t, op=dist._make_nccl_premul_sum(f), async_op=a), mode)  # fmt: skip
        total = scale * sum(k + 1 for k in range(n))
        assert torch.allclose(x, torch.full((6,), total)), (factor, x)
        out = torch.empty(2)
        source = torch.full((2 * n,), float(r + 1))
        run_op(lambda a, o=out, s=source, f=factor: dist.reduce_scatter_tensor(
            o, s, op=dist._make_nccl_premul_sum(f), async_op=a), mode)  # fmt: skip
        assert torch.allclose(out, torch.full((2,), total))
        assert torch.equal(source, torch.full((2 * n,), float(r + 1)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_premul_sum_with_scalar_and_tensor_factor(rank_pools, world_size, mode):
    rank_pools(world_size).run(_premul_sum, mode)


# ---- dtypes ---------------------------------------------------------------------------------


def _allreduce_dtypes(ctx, mode, dtype, op_name):
    n, r = ctx.world_size, ctx.rank
    op = getattr(dist.ReduceOp, op_name)
    values = [float(k + 1) for k in range(n)]
    x = torch.full((16,), values[r]).to(dtype)
    run_op(lambda a: dist.all_reduce(x, op=op, async_op=a), mode)
    expected = {"SUM": sum(values), "MAX": max(values), "MIN": min(values),
                "PRODUCT": float(torch.tensor(values).prod())}[op_name]  # fmt: skip
    assert torch.equal(x, torch.full((16,), expected).to(dtype)), (dtype, op_name, x)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32],
    ids=["float16", "bfloat16", "int8", "uint8", "int32"],
)
@pytest.mark.parametrize("op_name", ["SUM", "MAX", "MIN", "PRODUCT"])
def test_allreduce_over_dtypes(rank_pools, world_size, mode, dtype, op_name):
    rank_pools(world_size).run(_allreduce_dtypes, mode, dtype, op_name)


def _bool_reductions(ctx, mode):
    # SUM is a logical or, PRODUCT and MIN a logical and, MAX a logical or.
    mine = torch.tensor([True, ctx.rank == 0, False, True])
    expect_or = torch.tensor([True, True, False, True])
    expect_and = torch.tensor([True, False, False, True])
    for op, expected in [
        (dist.ReduceOp.SUM, expect_or),
        (dist.ReduceOp.MAX, expect_or),
        (dist.ReduceOp.PRODUCT, expect_and),
        (dist.ReduceOp.MIN, expect_and),
    ]:
        x = mine.clone()
        run_op(lambda a, t=x, o=op: dist.all_reduce(t, op=o, async_op=a), mode)
        assert torch.equal(x, expected), (op, x)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_bool_reductions_are_logical(rank_pools, world_size, mode):
    rank_pools(world_size).run(_bool_reductions, mode)
