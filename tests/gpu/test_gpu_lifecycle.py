"""The lifecycle defects of issue 16 that a real GPU can show, world size 1. The fake GPU
(tests/test_nccl_lifecycle.py) shows each of them without one; these check that the real
CUDA caching allocator, graphs and NCCL agree. `bash scripts/gpu-check.sh` runs them.

The GPU is kept busy with `torch.cuda._sleep` so that ops are still queued when the host acts:
a backend that dropped, released or aborted them early would be seen."""

import time
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the NCCL path is compiled, not run"
)

GARBAGE = -7.0
BUSY_CYCLES = 200_000_000  # a few tenths of a second of GPU time


@pytest.fixture
def group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(
        "streamnccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    yield dist.distributed_c10d._get_default_group()
    if dist.is_initialized():
        dist.destroy_process_group()


def values(seed, *shape):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)).cuda() + 1


def test_destroy_finishes_every_async_op(group):
    # Defect 1: the ops are queued behind a busy GPU when the group goes; each must complete.
    inputs = [values(seed, 1 << 16) for seed in range(8)]
    outputs = [torch.full((1 << 16,), GARBAGE, device="cuda") for _ in inputs]
    dist.all_reduce(torch.ones(1, device="cuda"))  # connected before the GPU gets busy
    torch.cuda._sleep(BUSY_CYCLES)
    for output, x in zip(outputs, inputs, strict=True):
        dist.all_gather_into_tensor(output, x, async_op=True)
    dist.destroy_process_group()
    torch.cuda.synchronize()
    for output, x in zip(outputs, inputs, strict=True):
        assert torch.equal(output, x)


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
def test_bitwise_reductions_are_refused_at_the_call(group, op):
    # Defect 2: NCCL has no bitwise reductions; refused before anything is enqueued.
    x = torch.ones(4, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="NCCL has no bitwise reductions"):
        dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
    y = values(3, 4)
    out = torch.full((4,), GARBAGE, device="cuda")
    dist.all_gather_into_tensor(out, y)  # the group is still usable
    assert torch.equal(out, y)


def test_a_captured_op_keeps_its_temporary_across_replays(group):
    # Defect 4: a non-contiguous input is copied into a temporary from the graph's pool, read by
    # NCCL on the internal stream. Let go before wait(), the next allocation of the capture gets
    # its memory and overwrites it at every replay before NCCL reads it.
    source = torch.zeros(8, 16, device="cuda")
    out = torch.full((128,), GARBAGE, device="cuda")
    dist.all_reduce(out, async_op=True).wait()  # connected, streams made, before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work = dist.all_gather_into_tensor(out, source.t(), async_op=True)
        reused = torch.full((16, 8), 99.0, device="cuda")  # the temporary's size, same stream
        work.wait()
    del reused
    for value in (2.0, 5.0):
        source.copy_(values(int(value), 8, 16))
        out.fill_(GARBAGE)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, source.t().contiguous().flatten())


def test_kept_works_do_not_keep_their_inputs(group):
    # Defect 6: once an op completes, its Work lets go of what it no longer needs, so a list of
    # Works does not keep every input alive (an all_gather's Work keeps its outputs, which are
    # its result; its input is the memory to watch).
    probe = torch.ones(1, device="cuda")
    dist.all_reduce(probe)
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    elements = 1 << 20
    works = []
    for seed in range(4):
        x = values(seed, elements)
        out = torch.empty(elements, device="cuda")
        works.append(dist.all_gather_into_tensor(out, x, async_op=True))
        del x, out
    torch.cuda.synchronize()
    allowed = baseline + len(works) * elements * 4 + (1 << 20)  # the outputs, and some slack
    deadline = time.monotonic() + 10
    while torch.cuda.memory_allocated() > allowed:
        assert time.monotonic() < deadline, (
            f"{torch.cuda.memory_allocated() - baseline} bytes still held by {len(works)} "
            f"completed Works, whose outputs take {len(works) * elements * 4}"
        )
        dist.all_reduce(probe)  # a call on the group lets go of what the watchdog saw complete
        time.sleep(0.05)
    assert all(work.is_completed() for work in works)


def test_the_flight_recorder_shows_a_queued_op_as_scheduled(group):
    # Defect 8: issued is not started. Behind a busy GPU the op has not started; without timing
    # there is no start event, so it stays scheduled until it completes.
    x = values(9, 1024)
    dist.all_reduce(x)
    torch.cuda._sleep(BUSY_CYCLES)
    work = dist.all_reduce(x, async_op=True)
    entries = streamnccl.flight_recorder()["entries"]
    assert entries[-1]["state"] == "scheduled", entries[-1]
    work.wait()
    torch.cuda.synchronize()
