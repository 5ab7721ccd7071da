"""Bad input raises at the call with a message naming the op, the argument and what was
expected, and the group stays usable: a valid op right after gives the right value."""

import re

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

WORLD_SIZES = [2, 3]


def cpu_backend():
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))


def assert_group_usable(ctx):
    x = torch.full((3,), float(ctx.rank))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((3,), float(sum(range(ctx.world_size)))))


def expect_error(ctx, error_type, pattern, call):
    with pytest.raises(error_type, match=pattern):
        call()
    assert_group_usable(ctx)


def fake_cuda_tensor(*shape):
    # A tensor that claims to be on cuda:0 without a GPU; it reaches the backend only when
    # called directly (through torch.distributed, FakeTensorMode answers for it).
    with FakeTensorMode():
        return torch.empty(*shape, device="cuda")


# Each case: (name, error type, message pattern, call(ctx)).
def _cases():
    n = dist.get_world_size()
    ones = torch.ones(4)

    def gather_into(outputs, tensor=ones):
        return lambda: dist.all_gather(outputs, tensor)

    return [
        (
            "allgather output list too short",
            ValueError,
            rf"streamnccl allgather: `output_tensor_list` has {n - 1} tensors, expected one per "
            rf"rank: {n}",
            gather_into([torch.empty(4) for _ in range(n - 1)]),
        ),
        (
            "allgather output list too long",
            ValueError,
            rf"`output_tensor_list` has {n + 1} tensors, expected one per rank: {n}",
            gather_into([torch.empty(4) for _ in range(n + 1)]),
        ),
        (
            "allgather output of the wrong size",
            ValueError,
            r"allgather: `output_tensor_list\[1\]` has 5 elements \(shape \[5\]\), expected as "
            r"many as the single tensor: 4",
            gather_into([torch.empty(4), torch.empty(5)] + [torch.empty(4)] * (n - 2)),
        ),
        (
            "allgather output of another dtype",
            TypeError,
            r"allgather: `output_tensor_list\[0\]` has dtype Double but the input has dtype Float",
            # Direct: torch.distributed checks dtypes itself before it reaches the backend.
            lambda: cpu_backend().allgather(
                [[torch.empty(4, dtype=torch.float64)] + [torch.empty(4)] * (n - 1)], [ones]
            ),
        ),
        (
            "allgather tensors on two devices",
            ValueError,
            r"allgather: `output_tensor_list\[1\]` is on meta but the input is on cpu; all "
            r"tensors of one call must be on one device",
            gather_into(
                [torch.empty(4), torch.empty(4, device="meta")] + [torch.empty(4)] * (n - 2)
            ),
        ),
        (
            "broadcast root past the last rank",
            ValueError,
            rf"streamnccl broadcast: `src` is {n}, expected a rank in \[0, {n}\)",
            lambda: dist.broadcast(torch.ones(2), src=n),
        ),
        (
            "broadcast root far out of range",
            ValueError,
            rf"`src` is {n + 7}, expected a rank in \[0, {n}\)",
            lambda: dist.broadcast(torch.ones(2), src=n + 7, async_op=True),
        ),
        (
            "broadcast negative root, direct",
            ValueError,
            rf"broadcast: `src` is -1, expected a rank in \[0, {n}\)",
            lambda: cpu_backend().broadcast(torch.ones(2), -1),
        ),
        (
            "allreduce of two tensors in one call",
            ValueError,
            r"allreduce: expected exactly one tensor in `tensor`, got 2",
            lambda: cpu_backend().allreduce([torch.ones(2), torch.ones(2)]),
        ),
        (
            "allreduce of no tensor",
            ValueError,
            r"allreduce: expected exactly one tensor in `tensor`, got 0",
            lambda: cpu_backend().allreduce([]),
        ),
        (
            "allreduce AVG of integers",
            TypeError,
            r"allreduce: reduce op AVG needs a floating-point or complex dtype, got Long",
            lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG),
        ),
        (
            "allreduce bitwise op on floats",
            TypeError,
            r"allreduce: reduce op BAND needs an integer or bool dtype, got Float",
            lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND),
        ),
        (
            "allreduce MAX of complex",
            TypeError,
            r"allreduce: reduce op MAX is not defined for complex dtype ComplexFloat",
            # Direct: torch.distributed refuses this one itself before the backend sees it.
            lambda: cpu_backend().allreduce(
                [torch.ones(2, dtype=torch.complex64)], dist.ReduceOp.MAX
            ),
        ),
        (
            "allreduce PREMUL_SUM of integers",
            TypeError,
            r"allreduce: reduce op PREMUL_SUM needs a floating-point or complex dtype, got Long",
            lambda: dist.all_reduce(
                torch.ones(2, dtype=torch.int64), op=dist._make_nccl_premul_sum(2.0)
            ),
        ),
        (
            "allreduce of a meta tensor",
            ValueError,
            r"allreduce: tensors on meta are not supported by this build of streamnccl",
            lambda: cpu_backend().allreduce([torch.ones(2, device="meta")]),
        ),
        (
            "allreduce of a sparse tensor",
            ValueError,
            r"allreduce: `tensor` must be a dense \(strided\) tensor, got layout Sparse",
            lambda: cpu_backend().allreduce([torch.ones(2).to_sparse()]),
        ),
    ]


def _bad_input_case(ctx, index):
    name, error_type, pattern, call = _cases()[index]
    expect_error(ctx, error_type, pattern, call)
    return name


CASE_NAMES = [
    "allgather output list too short",
    "allgather output list too long",
    "allgather output of the wrong size",
    "allgather output of another dtype",
    "allgather tensors on two devices",
    "broadcast root past the last rank",
    "broadcast root far out of range",
    "broadcast negative root, direct",
    "allreduce of two tensors in one call",
    "allreduce of no tensor",
    "allreduce AVG of integers",
    "allreduce bitwise op on floats",
    "allreduce MAX of complex",
    "allreduce PREMUL_SUM of integers",
    "allreduce of a meta tensor",
    "allreduce of a sparse tensor",
]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASE_NAMES)), ids=CASE_NAMES)
def test_bad_input_raises_at_the_call_and_group_stays_usable(rank_pools, world_size, index):
    names = rank_pools(world_size).run(_bad_input_case, index)
    assert names == [CASE_NAMES[index]] * world_size


def _cuda_tensor_without_gpu(ctx):
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
    for call in (
        lambda: backend.allreduce([fake_cuda_tensor(4)]),
        lambda: backend.broadcast(fake_cuda_tensor(4), 0),
        lambda: backend.allgather([[fake_cuda_tensor(4)] * ctx.world_size], [fake_cuda_tensor(4)]),
    ):
        expect_error(
            ctx,
            ValueError,
            re.escape("cannot use cuda:0: this process sees no CUDA device")
            + "|"
            + re.escape("not supported by this build of streamnccl (paths built: host only)"),
            call,
        )


@pytest.mark.skipif(
    torch.cuda.device_count() > 0, reason="a GPU is present: cuda tensors are valid"
)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_cuda_tensor_without_gpu_is_a_clear_error(rank_pools, world_size):
    rank_pools(world_size).run(_cuda_tensor_without_gpu)


def _wrong_pg_options_type(ctx):
    with pytest.raises(TypeError, match="pg_options must be a streamnccl.Options, got int"):
        dist.new_group(backend="streamnccl", pg_options=3)
    assert_group_usable(ctx)


def test_wrong_pg_options_type(rank_pools):
    rank_pools(2).run(_wrong_pg_options_type)
