"""gather, scatter, all_gather_into_tensor, all_gather_coalesced, all_to_all (list and single,
with equal, uneven and empty splits) and the object collectives, sync and async, against Gloo
and closed forms; and dtypes that only move (bool, float8, bfloat16, complex)."""

import pytest
import torch
import torch.distributed as dist
from collective_helpers import MODES, run_op

WORLD_SIZES = [2, 3, 4]


def _gather_scatter(ctx, mode):
    n, me = ctx.world_size, ctx.rank
    for root in range(n):
        x = torch.randn(4, 3, generator=ctx.seed(root))
        expected = [torch.empty_like(x) for _ in range(n)] if me == root else None
        dist.gather(x, expected, dst=root, group=ctx.gloo)
        got = [torch.full_like(x, -1) for _ in range(n)] if me == root else None
        run_op(lambda a, t=x, g=got, r=root: dist.gather(t, g, dst=r, async_op=a), mode)
        if me == root:
            for g, e in zip(got, expected, strict=True):
                assert torch.equal(g, e)
        # scatter: the root sends chunk r to rank r; closed form.
        chunks = [torch.full((5,), float(10 * root + r)) for r in range(n)] if me == root else None
        out = torch.empty(5)
        run_op(lambda a, o=out, c=chunks, r=root: dist.scatter(o, c, src=r, async_op=a), mode)
        assert torch.equal(out, torch.full((5,), float(10 * root + me)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_gather_and_scatter_for_every_root(rank_pools, world_size, mode):
    rank_pools(world_size).run(_gather_scatter, mode)


def _gather_into_tensor(ctx, mode):
    n, me = ctx.world_size, ctx.rank
    for root in range(n):
        x = torch.randn(4, 3, generator=ctx.seed(root))
        expected = [torch.empty_like(x) for _ in range(n)] if me == root else None
        dist.gather(x, expected, dst=root, group=ctx.gloo)
        got = torch.full((n, 4, 3), -1.0) if me == root else None
        run_op(lambda a, t=x, g=got, r=root: dist.gather_into_tensor(t, g, dst=r, async_op=a), mode)
        if me == root:
            assert torch.equal(got, torch.stack(expected))


needs_gather_into_tensor = pytest.mark.skipif(
    not hasattr(dist, "gather_into_tensor"), reason="torch before 2.14 has no gather_into_tensor"
)


@pytest.mark.torch_internals
@needs_gather_into_tensor
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_gather_into_tensor_for_every_root(rank_pools, world_size, mode):
    rank_pools(world_size).run(_gather_into_tensor, mode)


def _gather_into_tensor_flat_empty_and_refused(ctx):
    n, me = ctx.world_size, ctx.rank
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2).t() + 10 * me  # not contiguous
    flat = torch.empty(n * 6) if me == 0 else None
    dist.gather_into_tensor(x, flat, dst=0)
    if me == 0:
        assert torch.equal(
            flat.view(n, 2, 3), torch.stack([x - 10 * me + 10 * r for r in range(n)])
        )
    nothing = torch.empty(0, 4) if me == 0 else None
    dist.gather_into_tensor(torch.empty(0), nothing, dst=0)
    if me == 0:  # refused at the root, before anything runs; the group goes on
        for bad, error, pattern in [
            (torch.empty(n * 6 + 1), ValueError, "output` has .* elements"),
            (torch.empty(n * 6, dtype=torch.float64), ValueError, "dtype"),  # torch's own
            (torch.empty(6, n).t(), ValueError, "contiguous"),
        ]:
            with pytest.raises(error, match=pattern):
                dist.gather_into_tensor(x, bad, dst=0)
    total = torch.ones(2)
    dist.all_reduce(total)
    assert torch.equal(total, torch.full((2,), float(n)))


@pytest.mark.torch_internals
@needs_gather_into_tensor
def test_gather_into_tensor_takes_a_flat_output_and_empty_inputs_and_refuses_bad_ones(rank_pools):
    rank_pools(2).run(_gather_into_tensor_flat_empty_and_refused)


def _all_gather_into_tensor(ctx, mode):
    n = ctx.world_size
    x = torch.randn(3, 2, generator=ctx.seed(1))
    expected = torch.empty(n * 3, 2)
    dist.all_gather_into_tensor(expected, x, group=ctx.gloo)
    out = torch.full((n * 3, 2), -1.0)
    run_op(lambda a: dist.all_gather_into_tensor(out, x, async_op=a), mode)
    assert torch.equal(out, expected)
    # Stacked form: output of shape (n, 3, 2).
    stacked = torch.empty(n, 3, 2)
    run_op(lambda a: dist.all_gather_into_tensor(stacked, x, async_op=a), mode)
    assert torch.equal(stacked.reshape(n * 3, 2), expected)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_all_gather_into_tensor(rank_pools, world_size, mode):
    rank_pools(world_size).run(_all_gather_into_tensor, mode)


def _all_to_all_single(ctx, mode, splits_kind):
    n, me = ctx.world_size, ctx.rank
    if splits_kind == "equal":
        in_splits = out_splits = None
        rows_in = rows_out = 2 * n
        sizes = [[2] * n for _ in range(n)]  # sizes[src][dst]
    else:
        # Rank s sends (s + d) % 3 rows to rank d (uneven), or nothing to odd ranks (empty).
        def rows(s, d):
            return 0 if splits_kind == "empty" and d % 2 == 1 else (s + d) % 3 + (s == d)

        sizes = [[rows(s, d) for d in range(n)] for s in range(n)]
        in_splits = sizes[me]
        out_splits = [sizes[s][me] for s in range(n)]
        rows_in, rows_out = sum(in_splits), sum(out_splits)
    # Row values encode (source, destination, index), so the result is a closed form.
    send_rows = [100 * me + 10 * d + i for d in range(n) for i in range(sizes[me][d])]
    x = torch.tensor(send_rows, dtype=torch.float64).reshape(rows_in, 1).repeat(1, 3)
    expected_rows = [100 * s + 10 * me + i for s in range(n) for i in range(sizes[s][me])]
    expected = torch.tensor(expected_rows, dtype=torch.float64).reshape(rows_out, 1).repeat(1, 3)
    gloo_out = torch.empty(rows_out, 3, dtype=torch.float64)
    dist.all_to_all_single(gloo_out, x, out_splits, in_splits, group=ctx.gloo)
    assert torch.equal(gloo_out, expected)
    out = torch.full((rows_out, 3), -1.0, dtype=torch.float64)
    run_op(lambda a: dist.all_to_all_single(out, x, out_splits, in_splits, async_op=a), mode)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits_kind", ["equal", "uneven", "empty"])
def test_all_to_all_single(rank_pools, world_size, mode, splits_kind):
    rank_pools(world_size).run(_all_to_all_single, mode, splits_kind)


def _all_to_all_single_in_place(ctx, mode):
    # One tensor as input and output: every block is sent before this rank's is overwritten.
    n, me = ctx.world_size, ctx.rank
    x = torch.tensor([100 * me + 10 * d + i for d in range(n) for i in range(2)]).double()
    run_op(lambda a: dist.all_to_all_single(x, x, async_op=a), mode)
    assert x.tolist() == [100 * s + 10 * me + i for s in range(n) for i in range(2)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_all_to_all_single_in_place(rank_pools, world_size, mode):
    rank_pools(world_size).run(_all_to_all_single_in_place, mode)


def _all_to_all_list(ctx, mode):
    n, me = ctx.world_size, ctx.rank
    inputs = [torch.full((d + 1,), float(10 * me + d)) for d in range(n)]
    outputs = [torch.empty(me + 1) for _ in range(n)]
    run_op(lambda a: dist.all_to_all(outputs, inputs, async_op=a), mode)
    for s in range(n):
        assert torch.equal(outputs[s], torch.full((me + 1,), float(10 * s + me)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_all_to_all_list(rank_pools, world_size, mode):
    rank_pools(world_size).run(_all_to_all_list, mode)


def _all_to_all_list_in_place(ctx, mode):
    # One list as inputs and outputs: every block is sent before this rank's is overwritten.
    n, me = ctx.world_size, ctx.rank
    blocks = [torch.full((3,), float(10 * me + d)) for d in range(n)]
    run_op(lambda a: dist.all_to_all(blocks, blocks, async_op=a), mode)
    assert [b.tolist() for b in blocks] == [[float(10 * s + me)] * 3 for s in range(n)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_all_to_all_list_in_place(rank_pools, world_size, mode):
    rank_pools(world_size).run(_all_to_all_list_in_place, mode)


def _coalesced_inputs(rank):
    """Rank `rank`'s inputs of all_gather_coalesced: shapes differ, one is empty, one complex."""
    g = torch.Generator().manual_seed(7919 * (rank + 1))
    return [
        torch.randn(2, 3, generator=g),
        torch.empty(0),
        torch.randn(4, generator=g, dtype=torch.complex64),
        torch.randn(5, generator=g),
    ]


def _all_gather_coalesced(ctx, mode):
    n = ctx.world_size
    inputs = _coalesced_inputs(ctx.rank)
    expected = [[torch.empty_like(t) for t in inputs] for _ in range(n)]
    dist.all_gather_coalesced(expected, inputs, group=ctx.gloo)
    got = [[torch.full_like(t, -1) for t in inputs] for _ in range(n)]
    if mode == "sync":
        assert dist.all_gather_coalesced(got, inputs) is None
    else:
        future = dist.all_gather_coalesced(got, inputs, async_op=True)
        future.wait()
        assert future.done()
    for r in range(n):
        for g, e, closed_form in zip(got[r], expected[r], _coalesced_inputs(r), strict=True):
            assert torch.equal(g, e)
            assert torch.equal(g, closed_form)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_all_gather_coalesced(rank_pools, world_size, mode):
    rank_pools(world_size).run(_all_gather_coalesced, mode)


MOVE_ONLY_DTYPES = [torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16,
                    torch.complex128, torch.int16]  # fmt: skip


def _movement_dtypes(ctx, mode):
    n, me = ctx.world_size, ctx.rank
    for dtype in MOVE_ONLY_DTYPES:
        base = torch.randn(6, generator=ctx.seed(3))
        x = (base > 0) if dtype == torch.bool else base.to(dtype)
        # broadcast from the last rank
        b = x.clone()
        run_op(lambda a, t=b: dist.broadcast(t, src=n - 1, async_op=a), mode)
        gathered = [torch.empty_like(x) for _ in range(n)]
        run_op(lambda a, g=gathered, t=x: dist.all_gather(g, t, async_op=a), mode)
        # every rank's bytes arrive intact: compare through a byte view
        mine = gathered[me].view(torch.uint8)
        assert torch.equal(mine, x.view(torch.uint8)), dtype
        assert torch.equal(b.view(torch.uint8), gathered[n - 1].view(torch.uint8)), dtype


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_dtypes_that_only_move(rank_pools, world_size, mode):
    rank_pools(world_size).run(_movement_dtypes, mode)


def _object_collectives(ctx):
    n, me = ctx.world_size, ctx.rank
    objects = [{"rank": me, "name": f"r{me}"} if me == 1 else None]
    dist.broadcast_object_list(objects, src=1)
    assert objects == [{"rank": 1, "name": "r1"}]
    everyone = [None] * n
    dist.all_gather_object(everyone, ("hello", me))
    assert everyone == [("hello", r) for r in range(n)]
    gathered = [None] * n if me == 0 else None
    dist.gather_object([me] * me, gathered, dst=0)
    if me == 0:
        assert gathered == [[r] * r for r in range(n)]
    received = [None]
    dist.scatter_object_list(received, [f"to {r}" for r in range(n)] if me == n - 1 else None,
                             src=n - 1)  # fmt: skip
    assert received == [f"to {me}"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_object_collectives(rank_pools, world_size):
    rank_pools(world_size).run(_object_collectives)


def _zero_elements(ctx, mode):
    n = ctx.world_size
    empty = torch.empty(0, 3)
    run_op(lambda a: dist.broadcast(empty, src=0, async_op=a), mode)
    run_op(lambda a: dist.reduce(empty, dst=0, async_op=a), mode)
    outs = [torch.empty(0, 3) for _ in range(n)]
    run_op(lambda a: dist.all_gather(outs, empty, async_op=a), mode)
    run_op(lambda a: dist.all_gather_into_tensor(torch.empty(0), torch.empty(0), async_op=a), mode)
    run_op(lambda a: dist.reduce_scatter_tensor(torch.empty(0), torch.empty(0), async_op=a), mode)
    run_op(lambda a: dist.all_to_all_single(torch.empty(0), torch.empty(0), async_op=a), mode)
    # The group still computes right after.
    x = torch.ones(2)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((2,), float(n)))
    assert all(o.shape == (0, 3) for o in outs)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_zero_element_tensors(rank_pools, world_size, mode):
    rank_pools(world_size).run(_zero_elements, mode)
