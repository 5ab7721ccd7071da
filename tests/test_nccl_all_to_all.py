"""all_to_all_single on the NCCL path, over fake ranks that meet (csrc/fake/): without splits
it is one ncclAlltoAll on every rank (NCCL 2.28+), with splits, or on an older NCCL, a group of
sends and recvs; either way each rank gets every other rank's block for it, in place too."""

import gc

import fakes
import pytest
import torch
from fakes import connect, fake_ranks, needs_nccl_path, opts, run_ranks
from streamnccl import _testing
from torch._C._distributed_c10d import AllreduceOptions, AllToAllOptions

pytestmark = needs_nccl_path

SIZE = 3
ROWS = 2  # per block


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _testing.FakeGpu.forget_thread_device()


def _blocks_from(rank):
    """Rank `rank`'s input: block d, for rank d, holds 100 * rank + 10 * d + row."""
    return torch.tensor([100 * rank + 10 * d + i for d in range(SIZE) for i in range(ROWS)]).float()


def _blocks_for(rank):
    return [float(100 * s + 10 * rank + i) for s in range(SIZE) for i in range(ROWS)]


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
@pytest.mark.parametrize(
    ("nccl_version", "splits", "expected_call"),
    [
        (None, [], "ncclAlltoAll"),
        (None, [ROWS] * SIZE, "ncclSend"),  # given, so maybe uneven elsewhere
        (22705, [], "ncclSend"),  # NCCL 2.27 has no ncclAlltoAll
    ],
    ids=["no_splits", "splits_given", "nccl_2_27"],
)
def test_every_rank_gets_its_blocks(nccl_version, splits, expected_call, in_place, async_op):
    groups = fake_ranks(SIZE)
    for _, gpu in groups:
        if nccl_version is not None:
            gpu.set_nccl_version(nccl_version)  # the NCCL loaded, before the group opens its path
    connect(groups)

    def exchange(rank, pg, gpu):
        x = _blocks_from(rank)
        out = x if in_place else torch.full_like(x, -1.0)
        gpu.clear()
        work = pg.alltoall_base(out, x, splits, splits, opts(AllToAllOptions, async_op))
        work.wait()
        assert gpu.synchronize()
        return out.tolist(), gpu.calls()

    for rank, (out, calls) in enumerate(run_ranks(groups, exchange)):
        assert out == _blocks_for(rank)
        nccl = [c.split("(")[0] for c in calls if c.startswith("nccl")]
        assert expected_call in nccl, calls
        other = {"ncclAlltoAll": "ncclSend", "ncclSend": "ncclAlltoAll"}[expected_call]
        assert other not in nccl, calls
    fakes.shut_down(groups)
    for _, gpu in groups:
        # Among them: ncclAlltoAll handed buffers that overlap (NCCL has no in-place form).
        assert gpu.violations() == []


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_the_list_form_in_place_gets_every_block(async_op):
    # all_to_all(xs, xs): each recv lands in a buffer of its own, copied back after the group.
    groups = connect(fake_ranks(SIZE))

    def exchange(rank, pg, gpu):
        blocks = [torch.full((ROWS,), float(10 * rank + d)) for d in range(SIZE)]
        pg.alltoall(blocks, blocks, opts(AllToAllOptions, async_op)).wait()
        assert gpu.synchronize()
        return [b.tolist() for b in blocks]

    for rank, blocks in enumerate(run_ranks(groups, exchange)):
        assert blocks == [[float(10 * s + rank)] * ROWS for s in range(SIZE)]
    fakes.shut_down(groups)
    for _, gpu in groups:
        assert gpu.violations() == []


def test_ranks_that_disagree_on_a_collectives_count_are_a_violation():
    # As NCCL, which would hang or move garbage; the fake moves nothing rather than read past
    # the smaller member's buffer.
    groups = connect(fake_ranks(2))

    def mismatch(rank, pg, gpu):
        x = torch.full((4 + rank,), 1.0)
        pg.allreduce([x], opts(AllreduceOptions)).wait()
        assert gpu.synchronize()
        return x.tolist()

    assert run_ranks(groups, mismatch) == [[1.0] * 4, [1.0] * 5]
    fakes.shut_down(groups)
    # Reported by whichever member's GPU ran the meeting.
    violations = [v for _, gpu in groups for v in gpu.violations()]
    assert any("different collectives" in v for v in violations), violations
