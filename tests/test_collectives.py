"""allreduce, broadcast, list allgather and barrier through the streamnccl backend, sync and
async, at world sizes 2 and 3: against closed-form values and against a Gloo group on random
per-rank data."""

import time
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist
from collective_helpers import MODES, run_op

WORLD_SIZES = [2, 3, 4]
OPS = {
    "SUM": dist.ReduceOp.SUM,
    "AVG": dist.ReduceOp.AVG,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
}


def random_tensor(ctx, i, shape, dtype):
    gen = ctx.seed(i)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=gen, dtype=dtype)


def gloo_allreduce(tensor, op_name, gloo):
    """What Gloo computes; Gloo has no AVG, so AVG is its SUM divided by the world size."""
    expected = tensor.clone()
    op = dist.ReduceOp.SUM if op_name == "AVG" else OPS[op_name]
    dist.all_reduce(expected, op=op, group=gloo)
    if op_name == "AVG":
        expected /= dist.get_world_size(gloo)
    return expected


# ---- allreduce ------------------------------------------------------------------------------


def _allreduce_closed_form(ctx, op_name, mode):
    n, r = ctx.world_size, ctx.rank
    tensor = torch.full((5, 3), float(r + 1), dtype=torch.float64)
    run_op(lambda a: dist.all_reduce(tensor, op=OPS[op_name], async_op=a), mode)
    values = [float(k + 1) for k in range(n)]
    expected = {
        "SUM": sum(values),
        "AVG": sum(values) / n,
        "PRODUCT": float(torch.tensor(values).prod()),
        "MIN": min(values),
        "MAX": max(values),
    }[op_name]
    assert torch.equal(tensor, torch.full((5, 3), expected, dtype=torch.float64)), tensor


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_allreduce_closed_form(rank_pools, world_size, mode, op_name):
    rank_pools(world_size).run(_allreduce_closed_form, op_name, mode)


def _allreduce_against_gloo(ctx, op_name, mode, dtype, shape):
    x = random_tensor(ctx, 1, shape, dtype)
    if op_name == "PRODUCT" and dtype.is_floating_point:
        x = 1 + x / 10  # keeps products of several ranks in range
    expected = gloo_allreduce(x, op_name, ctx.gloo)
    actual = x.clone()
    run_op(lambda a: dist.all_reduce(actual, op=OPS[op_name], async_op=a), mode)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


# Integer AVG is refused by design (see test_bad_input), so it is not in this matrix.
ALLREDUCE_CASES = [
    pytest.param(op_name, dtype, shape, id=f"{op_name}-{dtype_id}")
    for dtype, shape, dtype_id in [
        (torch.float32, (1000,), "float32"),
        (torch.float64, (7, 13), "float64"),
        (torch.int64, (257,), "int64"),
    ]
    for op_name in OPS
    if not (op_name == "AVG" and not dtype.is_floating_point)
]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name,dtype,shape", ALLREDUCE_CASES)
def test_allreduce_against_gloo(rank_pools, world_size, mode, op_name, dtype, shape):
    rank_pools(world_size).run(_allreduce_against_gloo, op_name, mode, dtype, shape)


def _allreduce_large_noncontiguous_complex(ctx, mode):
    # A transposed view: computed in a contiguous copy and written back.
    base = random_tensor(ctx, 2, (300, 200), torch.float32)
    expected = gloo_allreduce(base.t().contiguous(), "SUM", ctx.gloo)
    view = base.t()
    assert not view.is_contiguous()
    run_op(lambda a: dist.all_reduce(view, async_op=a), mode)
    torch.testing.assert_close(view, expected)
    # Complex as its real view; gloo reference on the real view too.
    z = random_tensor(ctx, 3, (64,), torch.complex64)
    expected_z = torch.view_as_complex(gloo_allreduce(torch.view_as_real(z), "SUM", ctx.gloo))
    run_op(lambda a: dist.all_reduce(z, async_op=a), mode)
    torch.testing.assert_close(z, expected_z)
    z = random_tensor(ctx, 4, (9,), torch.complex128)
    expected_z = torch.view_as_complex(gloo_allreduce(torch.view_as_real(z), "SUM", ctx.gloo))
    expected_z /= ctx.world_size
    run_op(lambda a: dist.all_reduce(z, op=dist.ReduceOp.AVG, async_op=a), mode)
    torch.testing.assert_close(z, expected_z)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_allreduce_noncontiguous_and_complex(rank_pools, world_size, mode):
    rank_pools(world_size).run(_allreduce_large_noncontiguous_complex, mode)


def _allreduce_zero_elements(ctx, mode):
    empty = torch.empty(0, 4)
    run_op(lambda a: dist.all_reduce(empty, async_op=a), mode)
    assert empty.shape == (0, 4)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_allreduce_zero_elements(rank_pools, world_size, mode):
    rank_pools(world_size).run(_allreduce_zero_elements, mode)


# ---- broadcast ------------------------------------------------------------------------------


def _broadcast(ctx, root, mode, dtype):
    x = random_tensor(ctx, 5, (33, 3), dtype)
    expected = x.clone()
    dist.broadcast(expected, src=root, group=ctx.gloo)
    run_op(lambda a: dist.broadcast(x, src=root, async_op=a), mode)
    assert torch.equal(x, expected)
    # Closed form: every rank ends with the root's rank number.
    marker = torch.full((4,), ctx.rank, dtype=torch.int32)
    run_op(lambda a: dist.broadcast(marker, src=root, async_op=a), mode)
    assert marker.tolist() == [root] * 4


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=["float32", "int64"])
def test_broadcast_from_every_root(rank_pools, world_size, mode, dtype):
    for root in range(world_size):
        rank_pools(world_size).run(_broadcast, root, mode, dtype)


def _broadcast_noncontiguous(ctx, mode):
    x = torch.full((4, 6), float(ctx.rank)).t()
    run_op(lambda a: dist.broadcast(x, src=ctx.world_size - 1, async_op=a), mode)
    assert torch.equal(x, torch.full((6, 4), float(ctx.world_size - 1)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_broadcast_noncontiguous(rank_pools, world_size, mode):
    rank_pools(world_size).run(_broadcast_noncontiguous, mode)


# ---- allgather ------------------------------------------------------------------------------


def _allgather(ctx, mode, dtype, shape):
    x = random_tensor(ctx, 6, shape, dtype)
    expected = [torch.empty_like(x) for _ in range(ctx.world_size)]
    dist.all_gather(expected, x, group=ctx.gloo)
    outputs = [torch.full_like(x, -1) for _ in range(ctx.world_size)]
    run_op(lambda a: dist.all_gather(outputs, x, async_op=a), mode)
    for got, want in zip(outputs, expected, strict=True):
        assert torch.equal(got, want)
    # Closed form: slot r holds rank r's number.
    mine = torch.full((3,), ctx.rank, dtype=torch.int64)
    slots = [torch.empty(3, dtype=torch.int64) for _ in range(ctx.world_size)]
    run_op(lambda a: dist.all_gather(slots, mine, async_op=a), mode)
    assert [s.tolist() for s in slots] == [[r] * 3 for r in range(ctx.world_size)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype,shape",
    [(torch.float32, (100, 7)), (torch.int32, (5,)), (torch.complex64, (8,))],
    ids=["float32", "int32", "complex64"],
)
def test_allgather_against_gloo(rank_pools, world_size, mode, dtype, shape):
    rank_pools(world_size).run(_allgather, mode, dtype, shape)


def _allgather_into_other_shapes(ctx, mode):
    # Outputs need the input's element count, not its shape; non-contiguous outputs work.
    x = torch.arange(6, dtype=torch.float32) + 10 * ctx.rank
    outputs = [torch.zeros(3, 2).t() for _ in range(ctx.world_size)]
    run_op(lambda a: dist.all_gather(outputs, x, async_op=a), mode)
    for r, out in enumerate(outputs):
        assert torch.equal(out.reshape(-1), (torch.arange(6.0) + 10 * r).reshape(2, 3).reshape(-1))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_allgather_into_other_shapes(rank_pools, world_size, mode):
    rank_pools(world_size).run(_allgather_into_other_shapes, mode)


# ---- barrier --------------------------------------------------------------------------------


def _barrier(ctx, device_ids):
    # Ranks arrive 0.3 s apart; none may leave before the last has arrived.
    time.sleep(0.3 * ctx.rank)
    arrived = time.time()
    dist.barrier(device_ids=device_ids and [ctx.rank])
    left = time.time()
    times = [None] * ctx.world_size
    dist.all_gather_object(times, (arrived, left), group=ctx.gloo)
    last_arrival = max(a for a, _ in times)
    assert all(leave >= last_arrival for _, leave in times), times


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_barrier_waits_for_the_last_rank(rank_pools, world_size):
    rank_pools(world_size).run(_barrier, device_ids=False)


@pytest.mark.torch_internals
@pytest.mark.skipif(torch.cuda.is_available(), reason="the device ids name real GPUs here")
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_barrier_naming_a_gpu_on_a_machine_without_one_runs_on_the_host(rank_pools, world_size):
    # As gloo's does, and as trainers call it (HF Accelerate's wait_for_everyone()).
    rank_pools(world_size).run(_barrier, device_ids=True)


# ---- program order --------------------------------------------------------------------------


def _many_async_in_flight(ctx):
    # Ops of one group run in program order: a chain of dependent async ops, waited at the end.
    x = torch.ones(1000)
    works = [dist.all_reduce(x, async_op=True) for _ in range(10)]
    for work in works:
        work.wait()
    assert torch.equal(x, torch.full((1000,), float(ctx.world_size**10)))
    # Sync after async: the sync op sees the async op's result.
    y = torch.ones(10)
    work = dist.all_reduce(y, async_op=True)
    dist.all_reduce(y)
    work.wait()
    assert torch.equal(y, torch.full((10,), float(ctx.world_size**2)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ops_run_in_program_order(rank_pools, world_size):
    rank_pools(world_size).run(_many_async_in_flight)


# ---- bitwise reductions (host path) ---------------------------------------------------------

BITWISE = {"BAND": dist.ReduceOp.BAND, "BOR": dist.ReduceOp.BOR, "BXOR": dist.ReduceOp.BXOR}


def _bitwise_allreduce(ctx, op_name, mode, dtype):
    x = torch.randint(0, 256, (64,), generator=ctx.seed(7), dtype=dtype)
    expected = x.clone()
    dist.all_reduce(expected, op=BITWISE[op_name], group=ctx.gloo)
    run_op(lambda a: dist.all_reduce(x, op=BITWISE[op_name], async_op=a), mode)
    assert torch.equal(x, expected)
    # Closed form: one bit per rank.
    bits = torch.tensor([1 << ctx.rank], dtype=dtype)
    run_op(lambda a: dist.all_reduce(bits, op=BITWISE[op_name], async_op=a), mode)
    every = (1 << ctx.world_size) - 1
    assert bits.item() == {"BAND": 0, "BOR": every, "BXOR": every}[op_name]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", list(BITWISE))
@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8], ids=["int32", "uint8"])
def test_bitwise_allreduce(rank_pools, world_size, mode, op_name, dtype):
    rank_pools(world_size).run(_bitwise_allreduce, op_name, mode, dtype)


def _direct_group(ctx, name):
    """A streamnccl group made directly over a store of the test's own, its host path on the
    pool's Gloo: the store's keys are the test's to read and write."""
    store = dist.PrefixStore(f"{name}/", dist.distributed_c10d._get_default_store())
    gloo = ctx.gloo._get_backend(torch.device("cpu"))
    group = streamnccl.ProcessGroup(
        store, ctx.rank, ctx.world_size, timedelta(seconds=30), streamnccl.Options(), gloo=gloo
    )
    return group, store


def _a_rank_that_has_the_device(ctx):
    group, store = _direct_group(ctx, "barrier_place")
    if ctx.rank == 1:  # answers as a rank that has a GPU would, and waits for no barrier
        store.set("streamnccl/barrier_place/cuda/1", "")
        group.shutdown()
        return None
    options = dist.BarrierOptions()
    options.device_ids = [0]
    first = pytest.raises(ValueError, group.barrier, options)
    again = pytest.raises(ValueError, group.barrier, options)  # agreed once, refused each time
    assert str(again.value) == str(first.value)
    group.shutdown()
    return str(first.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the device ids name real GPUs here")
def test_ranks_that_disagree_on_having_the_device_are_refused_rather_than_left_waiting(
    rank_pools,
):
    # Deciding alone, rank 0 would run its barrier on the host while a rank with a GPU ran its
    # own on NCCL: both would wait out the timeout. Agreed through the Store, every rank is
    # refused at once, naming the ranks without the device (here rank 0, the only one).
    refusal, _ = rank_pools(2).run(_a_rank_that_has_the_device)
    assert "rank(s) 0 have no cuda:0 where the others have one" in refusal, refusal
    assert "a barrier runs on one kind of device on every rank" in refusal


def _barrier_on_a_broken_group(ctx):
    group, _ = _direct_group(ctx, "broken_barrier")
    if ctx.rank == 0:
        group.abort()
        options = dist.BarrierOptions()
        options.device_ids = [0]
        started = time.monotonic()
        with pytest.raises(dist.DistBackendError, match="aborted by the caller"):
            group.barrier(options)
        assert time.monotonic() - started < 5, "it waited for the other ranks first"
    group.shutdown()


def test_a_barrier_on_a_broken_group_is_refused_at_once(rank_pools):
    # Before agreeing anything with the other ranks, whose keys would keep it waiting.
    rank_pools(2).run(_barrier_on_a_broken_group)
