"""all_to_all_single on the NCCL path, over fake ranks that meet (csrc/fake/): without splits
it is one ncclAlltoAll on every rank (NCCL 2.28+), with splits, or on an older NCCL, a group of
sends and recvs; either way each rank gets every other rank's block for it, in place too."""

import gc

import fakes
import pytest
import torch
from fakes import connect, fake_ranks, needs_nccl_path, opts, run_ranks
from streamnccl import _C
from torch._C._distributed_c10d import AllToAllOptions

pytestmark = needs_nccl_path

SIZE = 3
ROWS = 2  # per block


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _C._FakeGpu.forget_thread_device()


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
