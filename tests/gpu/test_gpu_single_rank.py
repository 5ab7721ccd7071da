"""The NCCL path on a real GPU, world size 1 (NCCL refuses two ranks on one GPU; the
examples and test_gpu_multi_rank.py take several). `bash scripts/gpu-check.sh` runs these.

At world size 1 a sum or a broadcast changes nothing, so a backend that did nothing would pass
such checks. Every check here would fail on one: outputs start as garbage and must be filled
from the inputs, PREMUL_SUM multiplies even alone, values differ per call, and wait() is
called from another stream than the launch's. Skipped with a reason without a GPU."""

import json
import time
from datetime import timedelta

import pytest
import streamnccl
import streamnccl._testing  # noqa: F401 (STREAMNCCL_TEST_FAULT is its hook)
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the NCCL path is compiled, not run"
)

GARBAGE = -7.0


@pytest.fixture
def group(tmp_path, monkeypatch):
    """A world of one on cuda:0; tests that need settings set STREAMNCCL_* first."""

    def make(**env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group(
            "streamnccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60)
        )
        return dist.distributed_c10d._get_default_group()

    yield make
    if dist.is_initialized():
        dist.destroy_process_group()


def finish(work, async_op):
    if async_op:
        assert work.wait()


def values(seed, *shape):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)).cuda() + 1


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_every_op_fills_its_outputs(group, async_op):
    group()
    for call in range(3):  # distinct values per call
        x = values(call, 6, 4)
        out = torch.full((6, 4), GARBAGE, device="cuda")
        finish(dist.all_gather_into_tensor(out, x, async_op=async_op), async_op)
        assert torch.equal(out, x)
        outs = [torch.full((6, 4), GARBAGE, device="cuda")]
        finish(dist.all_gather(outs, x, async_op=async_op), async_op)
        assert torch.equal(outs[0], x)
        part = torch.full((6, 4), GARBAGE, device="cuda")
        finish(dist.reduce_scatter_tensor(part, x, async_op=async_op), async_op)
        assert torch.equal(part, x)
        finish(dist.reduce_scatter(part.fill_(GARBAGE), [x], async_op=async_op), async_op)
        assert torch.equal(part, x)
        moved = torch.full((6, 4), GARBAGE, device="cuda")
        finish(dist.all_to_all_single(moved, x, async_op=async_op), async_op)
        assert torch.equal(moved, x)
        gathered = [torch.full((6, 4), GARBAGE, device="cuda")]
        finish(dist.gather(x, gathered, dst=0, async_op=async_op), async_op)
        assert torch.equal(gathered[0], x)
        scattered = torch.full((6, 4), GARBAGE, device="cuda")
        finish(dist.scatter(scattered, [x], src=0, async_op=async_op), async_op)
        assert torch.equal(scattered, x)
        coalesced = [
            [torch.full((6, 4), GARBAGE, device="cuda"), torch.full((3,), GARBAGE, device="cuda")]
        ]
        y = values(10 + call, 3)
        result = dist.all_gather_coalesced(coalesced, [x, y], async_op=async_op)
        if async_op:
            result.wait()
        assert torch.equal(coalesced[0][0], x) and torch.equal(coalesced[0][1], y)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_premul_sum_multiplies_even_alone(group, async_op):
    group()
    for call, factor in enumerate([2.5, torch.tensor(-3.0, device="cuda", dtype=torch.float64)]):
        x = values(call, 1000)
        expected = x * (factor if isinstance(factor, float) else factor.item())
        op = dist._make_nccl_premul_sum(factor)
        y = x.clone()
        finish(dist.all_reduce(y, op=op, async_op=async_op), async_op)
        torch.testing.assert_close(y, expected)
        z = x.clone()
        finish(dist.reduce(z, dst=0, op=op, async_op=async_op), async_op)
        torch.testing.assert_close(z, expected)
        part = torch.full((1000,), GARBAGE, device="cuda")
        finish(dist.reduce_scatter_tensor(part, x, op=op, async_op=async_op), async_op)
        torch.testing.assert_close(part, expected)


def test_wait_joins_the_stream_current_at_wait(group):
    # The op is launched on a busy stream and waited on from another one: the read on the
    # second stream must see the result.
    group()
    launch, reader = torch.cuda.Stream(), torch.cuda.Stream()
    x = values(1, 1 << 20)
    out = torch.full((1 << 20,), GARBAGE, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(launch):
        torch.cuda._sleep(50_000_000)  # keeps the launch stream, so the op, busy
        work = dist.all_gather_into_tensor(out, x, async_op=True)
    with torch.cuda.stream(reader):
        work.wait()
        doubled = out * 2
    reader.synchronize()
    assert torch.equal(doubled, x * 2)


def test_async_op_follows_earlier_work_and_wait_orders_later_work(group):
    group()
    x = torch.zeros(1 << 16, device="cuda")
    out = torch.full((1 << 16,), GARBAGE, device="cuda")
    torch.cuda._sleep(100_000_000)
    x.fill_(3.0)
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    work.wait()
    doubled = out * 2
    assert torch.equal(doubled, torch.full((1 << 16,), 6.0, device="cuda"))


def test_future_callback_sees_the_result(group):
    group()
    x = values(3, 8)
    out = torch.full((8,), GARBAGE, device="cuda")
    fut = dist.all_gather_into_tensor(out, x, async_op=True).get_future()
    seen = fut.then(lambda f: f.value()[0] * 2).wait()
    assert torch.equal(seen, x * 2)


def test_ddp_steps_through_the_backend(group):
    pg = group()
    backend = pg._get_backend(torch.device("cuda"))
    torch.manual_seed(0)

    def net():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    model, reference = net(), net()
    reference.load_state_dict(model.state_dict())
    model, reference = model.cuda(), reference.cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    ops_before = backend._get_sequence_number_for_group()
    for step in range(3):
        data = values(100 + step, 8, 16)
        for net in (ddp, reference):
            net.zero_grad()
            net(data).pow(2).mean().backward()
        for mine, theirs in zip(ddp.module.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(mine.grad, theirs.grad)
    assert backend._get_sequence_number_for_group() > ops_before, "DDP ran no collective"


def test_collectives_capture_in_a_cuda_graph_and_replay(group):
    group()
    x = torch.ones(16, device="cuda")
    out = torch.full((16,), GARBAGE, device="cuda")
    # Connect, and make the internal stream and events, before capturing: init is not
    # capturable. (A PREMUL_SUM op is made per call, so it stays out of graphs.)
    dist.all_reduce(out, async_op=True).wait()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_gather_into_tensor(out, x * 3)
        dist.all_reduce(out, op=dist.ReduceOp.AVG)
        work = dist.all_reduce(out, async_op=True)
        work.wait()
        doubled = out * 2
    for value in (5.0, 7.0):
        x.fill_(value)
        out.fill_(GARBAGE)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(doubled, torch.full((16,), value * 3 * 2, device="cuda"))


def test_a_capture_without_collectives_beside_work_in_flight(group):
    # The watchdog queries the in-flight op's event while this thread captures: in the
    # thread-local capture mode, which leaves this capture valid.
    group()
    x = values(4, 1 << 20)
    out = torch.empty(1 << 20, device="cuda")
    torch.cuda._sleep(200_000_000)
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    y = torch.ones(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        y.mul_(2)
        time.sleep(0.3)
    graph.replay()
    work.wait()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full((8,), 2.0, device="cuda"))
    assert torch.equal(out, x)


def test_a_dtype_nccl_cannot_reduce_is_refused_at_the_call(group):
    group()
    with pytest.raises(TypeError, match="NCCL cannot reduce dtype Short"):
        dist.all_reduce(torch.ones(4, device="cuda", dtype=torch.int16))
    x = values(5, 4)
    out = torch.full((4,), GARBAGE, device="cuda")
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out, x)
    major, _ = torch.cuda.get_device_capability()
    f8 = torch.ones(4, device="cuda", dtype=torch.float8_e4m3fn)
    if major >= 9:
        dist.all_reduce(f8)
        assert torch.equal(f8.float(), torch.ones(4, device="cuda"))
    else:
        with pytest.raises(TypeError, match="float8 reductions need compute capability 9.0"):
            dist.all_reduce(f8)


def test_an_nccl_failure_breaks_and_aborts_the_group(group):
    group(STREAMNCCL_TEST_FAULT="rank=0,op=2,action=fail")
    x = values(6, 4)
    dist.all_reduce(x)
    with pytest.raises(dist.DistBackendError, match=r"allreduce #2 .*injected fault"):
        dist.all_reduce(x)
    started = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
        dist.all_reduce(x)
    assert time.monotonic() - started < 1


def test_abort_makes_later_ops_raise_at_once(group):
    pg = group()
    x = values(7, 4)
    dist.all_reduce(x)
    pg._get_backend(torch.device("cuda")).abort()
    with pytest.raises(dist.DistBackendError, match="aborted by the caller"):
        dist.all_reduce(x)


def test_info_reports_the_nccl_torch_loads():
    info = streamnccl.info()
    assert "nccl" in info["paths"]
    assert info["nccl_loaded"] == ".".join(str(v) for v in torch.cuda.nccl.version())


def test_timing_profiler_and_stats_on_the_gpu(group, tmp_path):
    group(STREAMNCCL_ENABLE_TIMING="1")
    x = values(1, 1 << 20)
    gathered = torch.empty_like(x)
    busy = torch.randn(2048, 2048, device="cuda")
    torch.cuda.current_stream().synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        busy @ busy  # the caller's stream is busy: the timed span must still be the op's own
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        # Alone, NCCL has nothing to do for an in-place sum; an all_gather out of place must
        # move the data on the device (NCCL copies, with a kernel or cudaMemcpyAsync).
        dist.all_gather_into_tensor(gathered, x)
        torch.cuda.synchronize()
    assert work.is_completed() and work._get_duration() > 0
    assert torch.equal(gathered, x)
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    comms = [e for e in events if e.get("name") == "record_param_comms"]
    assert [e["args"]["Collective name"] for e in comms] == [
        "allreduce",
        "all_gather_into_tensor",
    ], comms
    on_device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
    moved = [
        e
        for e in on_device
        if ("nccl" in e["name"].lower() and e["cat"] == "kernel") or "DtoD" in e["name"]
    ]
    assert moved, f"no NCCL kernel or device copy in the trace: {[e['name'] for e in on_device]}"
    assert streamnccl.stats()["all_reduce"]["timed"] >= 1
