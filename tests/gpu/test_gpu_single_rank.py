"""The NCCL path on real GPUs, world size 1 (a rank per process is tested by the examples).
Skipped with a reason where no GPU is present; the build check in test_build.py still fails
if the NCCL path was not compiled."""

import pytest
import streamnccl  # noqa: F401
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the NCCL path is compiled, not run"
)


@pytest.fixture
def single_rank_group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("streamnccl", store=store, rank=0, world_size=1)
    yield dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()


@pytest.mark.parametrize("async_op", [False, True])
def test_allreduce_broadcast_allgather_on_gpu(single_rank_group, async_op):
    x = torch.arange(8.0, device="cuda")
    work = dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=async_op)
    if async_op:
        work.wait()
    assert torch.equal(x.cpu(), torch.arange(8.0))
    work = dist.broadcast(x, src=0, async_op=async_op)
    if async_op:
        work.wait()
    outputs = [torch.empty(8, device="cuda")]
    work = dist.all_gather(outputs, x, async_op=async_op)
    if async_op:
        work.wait()
    assert torch.equal(outputs[0].cpu(), torch.arange(8.0))


def test_async_wait_joins_the_current_stream(single_rank_group):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.ones(1 << 20, device="cuda")
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # side stream now waits for the op; the host does not
        y = x * 2
    side.synchronize()
    assert torch.equal(y.cpu(), torch.full((1 << 20,), 2.0))


def test_future_is_created_with_the_cuda_device(single_rank_group):
    x = torch.ones(4, device="cuda")
    fut = dist.all_reduce(x, async_op=True).get_future()
    assert torch.equal(fut.then(lambda f: f.value()[0] + 1).wait().cpu(), torch.full((4,), 2.0))


def test_async_op_follows_earlier_work_and_wait_orders_later_work(single_rank_group):
    # The caller's stream is kept busy, then writes the input: an op that did not wait for
    # the caller's stream would gather zeros, and a read after wait() that did not wait for
    # the op would double zeros.
    x = torch.zeros(1 << 16, device="cuda")
    out = torch.zeros(1 << 16, device="cuda")
    torch.cuda._sleep(100_000_000)
    x.fill_(3.0)
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    work.wait()
    doubled = out * 2
    assert torch.equal(doubled.cpu(), torch.full((1 << 16,), 6.0))


def test_sync_collectives_capture_in_a_cuda_graph(single_rank_group):
    x = torch.ones(16, device="cuda")
    out = torch.zeros(16, device="cuda")
    dist.all_gather_into_tensor(out, x)  # opens the communicator: init is not capturable
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_gather_into_tensor(out, x * 2)
        dist.all_reduce(out)
    x.fill_(5.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.full((16,), 10.0))
