"""Bad input raises at the call with a message naming the op, the argument and what was
expected, and the group stays usable: a valid op right after gives the right value."""

import re

import pytest
import streamnccl
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

WORLD_SIZES = [2, 3]


def cpu_backend():
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))


def gather_options(root):
    opts = dist.GatherOptions()
    opts.rootRank = root
    return opts


def scatter_options(root):
    opts = dist.ScatterOptions()
    opts.rootRank = root
    return opts


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
def _all_to_all_own_block_partly_in_place():
    n, me = dist.get_world_size(), dist.get_rank()
    memory = torch.zeros(2 * n + 1)
    inputs = [memory[2 * r : 2 * r + 2] for r in range(n)]
    outputs = [torch.empty(2) for _ in range(n)]
    outputs[me] = memory[2 * me + 1 : 2 * me + 3]  # one element of this rank's own input
    dist.all_to_all(outputs, inputs)


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
        # ---- reduce, gather, scatter ----
        (
            "reduce root out of range",
            ValueError,
            rf"streamnccl reduce: `dst` is {n}, expected a rank in \[0, {n}\)",
            lambda: dist.reduce(torch.ones(2), dst=n),
        ),
        (
            "reduce AVG of integers",
            TypeError,
            r"reduce: reduce op AVG needs a floating-point or complex dtype, got Int",
            lambda: dist.reduce(torch.ones(2, dtype=torch.int32), dst=0, op=dist.ReduceOp.AVG),
        ),
        (
            "gather root out of range, direct",
            ValueError,
            rf"gather: `dst` is {n + 1}, expected a rank in \[0, {n}\)",
            lambda: cpu_backend().gather([[]], [ones], gather_options(n + 1)),
        ),
        (
            "gather list too short on dst, non-empty elsewhere, direct",
            ValueError,
            rf"gather: `gather_list` has {n - 1} tensors, expected one per rank: {n}"
            rf"|gather: `gather_list` must be empty on a rank other than dst \(0\), got {n - 1}",
            lambda: cpu_backend().gather(
                [[torch.empty(4) for _ in range(n - 1)]], [ones], gather_options(0)
            ),
        ),
        (
            "gather list element of the wrong size, direct",
            ValueError,
            r"gather: `gather_list\[0\]` has 3 elements \(shape \[3\]\), expected as many as "
            r"the single tensor: 4|must be empty on a rank other than dst",
            lambda: cpu_backend().gather(
                [[torch.empty(3)] + [torch.empty(4)] * (n - 1)], [ones], gather_options(0)
            ),
        ),
        (
            "scatter root out of range, direct",
            ValueError,
            rf"scatter: `src` is -2, expected a rank in \[0, {n}\)",
            lambda: cpu_backend().scatter([torch.empty(4)], [[]], scatter_options(-2)),
        ),
        (
            "scatter list of another dtype, direct",
            # The root sees the dtype; the others a list they should not have passed.
            (TypeError, ValueError),
            r"scatter: `scatter_list\[1\]` has dtype Long but the input has dtype Float"
            r"|`scatter_list` must be empty on a rank other than src",
            lambda: cpu_backend().scatter(
                [torch.empty(4)],
                [[torch.empty(4), torch.ones(4, dtype=torch.int64)] + [torch.empty(4)] * (n - 2)],
                scatter_options(0),
            ),
        ),
        # ---- tensor forms ----
        (
            "all_gather_into_tensor output of the wrong size",
            ValueError,
            rf"all_gather_into_tensor: `output_tensor` has {4 * n + 1} elements "
            rf"\(shape \[{4 * n + 1}\]\), expected {n} \(world size\) x 4",
            lambda: dist.all_gather_into_tensor(torch.empty(4 * n + 1), ones),
        ),
        (
            "all_gather_into_tensor output on another device",
            ValueError,
            r"all_gather_into_tensor: `output_tensor` is on meta but the input is on cpu",
            # Direct: through torch.distributed a meta tensor gets torch's meta kernel.
            lambda: cpu_backend()._allgather_base(torch.empty(4 * n, device="meta"), ones),
        ),
        (
            "reduce_scatter_tensor input of the wrong size",
            ValueError,
            rf"reduce_scatter_tensor: `input` has 5 elements \(shape \[5\]\), expected {n} "
            rf"\(world size\) x 2",
            lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(5)),
        ),
        (
            "reduce_scatter_tensor input of another dtype, direct",
            TypeError,
            r"reduce_scatter_tensor: `input` has dtype Double but the input has dtype Float",
            lambda: cpu_backend()._reduce_scatter_base(
                torch.empty(2), torch.ones(2 * n, dtype=torch.float64)
            ),
        ),
        (
            "reduce_scatter list too long",
            ValueError,
            rf"reduce_scatter: `input_list` has {n + 1} tensors, expected one per rank: {n}",
            lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2)] * (n + 1)),
        ),
        (
            "reduce_scatter list element of the wrong size",
            ValueError,
            r"reduce_scatter: `input_list\[0\]` has 3 elements",
            lambda: dist.reduce_scatter(
                torch.empty(2), [torch.ones(3)] + [torch.ones(2)] * (n - 1)
            ),
        ),
        # ---- all_to_all ----
        (
            "all_to_all_single with too few splits",
            ValueError,
            rf"all_to_all_single: `input_split_sizes` has 1 entries, expected one per rank: {n}",
            lambda: dist.all_to_all_single(torch.empty(n), torch.ones(n), [1] * n, [n]),
        ),
        (
            "all_to_all_single splits that do not sum to the rows",
            ValueError,
            rf"all_to_all_single: `output_split_sizes` sums to {n + 1} rows, expected dim 0 of "
            rf"the tensor: {n}",
            lambda: dist.all_to_all_single(
                torch.empty(n), torch.ones(n), [2] + [1] * (n - 1), [1] * n
            ),
        ),
        (
            "all_to_all_single with a negative split",
            ValueError,
            r"all_to_all_single: `input_split_sizes\[0\]` is -1, expected a size >= 0",
            lambda: dist.all_to_all_single(
                torch.empty(n), torch.ones(n), [1] * n, [-1, 2] + [1] * (n - 2)
            ),
        ),
        (
            "all_to_all with this rank's output partly over its input",
            ValueError,
            r"all_to_all: `output_tensor_list\[\d+\]` partly overlaps `input_tensor_list",
            _all_to_all_own_block_partly_in_place,
        ),
        (
            "all_to_all_single even split of indivisible rows",
            ValueError,
            rf"all_to_all_single: `input_split_sizes` is empty \(even split\), so dim 0 "
            rf"\({n + 1}\) must be divisible by the world size {n}",
            lambda: dist.all_to_all_single(torch.empty(n + 1), torch.ones(n + 1)),
        ),
        (
            "all_to_all_single output of another dtype, direct",
            TypeError,
            r"all_to_all_single: `output` has dtype Int but the input has dtype Float",
            lambda: cpu_backend().alltoall_base(
                torch.empty(n, dtype=torch.int32), torch.ones(n), [], []
            ),
        ),
        (
            "all_to_all list too short",
            ValueError,
            rf"all_to_all: `output_tensor_list` has {n - 1} tensors, expected one per rank: {n}",
            lambda: dist.all_to_all([torch.empty(1)] * (n - 1), [torch.ones(1)] * n),
        ),
        (
            "all_to_all list of another dtype, direct",
            TypeError,
            r"all_to_all: `output_tensor_list\[0\]` has dtype Double but the input has dtype "
            r"Float",
            lambda: cpu_backend().alltoall(
                [torch.empty(1, dtype=torch.float64)] * n, [torch.ones(1)] * n
            ),
        ),
        # ---- point to point, coalescing, barrier ----
        (
            "send to a rank out of range, direct",
            ValueError,
            rf"streamnccl send: `dst` is {n}, expected a rank in \[0, {n}\)",
            lambda: cpu_backend().send([ones], n, 0),
        ),
        (
            "recv from a negative rank, direct",
            ValueError,
            rf"streamnccl recv: `src` is -1, expected a rank in \[0, {n}\)",
            lambda: cpu_backend().recv([torch.empty(4)], -1, 0),
        ),
        (
            "send to itself, direct",
            ValueError,
            rf"streamnccl send: `dst` is this rank \({dist.get_rank()}\); a rank cannot send to",
            lambda: cpu_backend().send([ones], dist.get_rank(), 0),
        ),
        (
            "recv from itself, direct",
            ValueError,
            rf"streamnccl recv: `src` is this rank \({dist.get_rank()}\); a rank cannot",
            lambda: cpu_backend().recv([torch.empty(4)], dist.get_rank(), 0),
        ),
        (
            "send of two tensors, direct",
            ValueError,
            r"send: expected exactly one tensor in `tensor`, got 2",
            lambda: cpu_backend().send([ones, ones], 0, 0),
        ),
        (
            "allreduce_coalesced of no tensors, direct",
            ValueError,
            r"allreduce_coalesced: `tensors` is empty",
            lambda: cpu_backend().allreduce_coalesced([]),
        ),
        (
            "allreduce_coalesced with a bad tensor after a good one, direct",
            ValueError,
            r"allreduce: tensors on meta are not supported",
            lambda: cpu_backend().allreduce_coalesced(
                [torch.ones(2), torch.ones(2, device="meta")]
            ),
        ),
        (
            "all_gather_coalesced with one output list per rank missing",
            ValueError,
            rf"allgather_coalesced: `output_tensor_lists` has {n - 1} lists, expected one per",
            lambda: dist.all_gather_coalesced([[torch.empty(4)]] * (n - 1), [ones]),
        ),
        (
            "all_gather_coalesced with an output list too short",
            ValueError,
            r"allgather_coalesced: `output_tensor_lists\[0\]` has 1 tensors, expected one per",
            lambda: dist.all_gather_coalesced([[torch.empty(4)]] * n, [ones, ones]),
        ),
        (
            "all_gather_coalesced output of the wrong size",
            ValueError,
            r"allgather_coalesced: `output_tensor_lists\[0\]\[1\]` has 3 elements \(shape "
            r"\[3\]\), expected as many as `input_tensor_list\[1\]`: 2",
            lambda: dist.all_gather_coalesced(
                [[torch.empty(4), torch.empty(3)]] * n, [ones, torch.ones(2)]
            ),
        ),
        (
            "all_gather_coalesced of no tensors, direct",
            ValueError,
            r"allgather_coalesced: `input_tensor_list` is empty",
            lambda: cpu_backend().allgather_coalesced([[]] * n, []),
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
    "reduce root out of range",
    "reduce AVG of integers",
    "gather root out of range, direct",
    "gather list too short on dst, non-empty elsewhere, direct",
    "gather list element of the wrong size, direct",
    "scatter root out of range, direct",
    "scatter list of another dtype, direct",
    "all_gather_into_tensor output of the wrong size",
    "all_gather_into_tensor output on another device",
    "reduce_scatter_tensor input of the wrong size",
    "reduce_scatter_tensor input of another dtype, direct",
    "reduce_scatter list too long",
    "reduce_scatter list element of the wrong size",
    "all_to_all_single with too few splits",
    "all_to_all_single splits that do not sum to the rows",
    "all_to_all_single with a negative split",
    "all_to_all with this rank's output partly over its input",
    "all_to_all_single even split of indivisible rows",
    "all_to_all_single output of another dtype, direct",
    "all_to_all list too short",
    "all_to_all list of another dtype, direct",
    "send to a rank out of range, direct",
    "recv from a negative rank, direct",
    "send to itself, direct",
    "recv from itself, direct",
    "send of two tensors, direct",
    "allreduce_coalesced of no tensors, direct",
    "allreduce_coalesced with a bad tensor after a good one, direct",
    "all_gather_coalesced with one output list per rank missing",
    "all_gather_coalesced with an output list too short",
    "all_gather_coalesced output of the wrong size",
    "all_gather_coalesced of no tensors, direct",
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
        # Connecting eagerly opens the path as the first op would.
        lambda: backend.eager_connect_single_device(torch.device("cuda", 0)),
        # Point-to-point opens the lanes to the peer instead of the group's path.
        lambda: backend.send([fake_cuda_tensor(4)], (ctx.rank + 1) % ctx.world_size, 0),
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


def _bad_nccl_config_at_new_group(ctx):
    options = streamnccl.Options(config=streamnccl.NcclConfig(min_ctas=0))
    with pytest.raises(ValueError, match="min_ctas is 0; expected 1 to 64"):
        dist.new_group(backend="streamnccl", pg_options=options)
    assert_group_usable(ctx)


def test_an_nccl_config_nccl_would_refuse_fails_at_group_creation(rank_pools):
    rank_pools(2).run(_bad_nccl_config_at_new_group)
