"""The in-flight write detector (Options(check_inflight_writes=True) or
STREAMNCCL_CHECK_INFLIGHT_WRITES=1): a tensor of an async op written before wait() raises there,
and, never waited for, is logged once per group. On the host path (2 ranks) and on the NCCL path
over the fake GPU; and silent on the ops' own writes, DDP and FSDP2. The examples run with it on
in test_examples.py."""

import contextlib
import os
import tempfile

import pytest
import streamnccl
import torch
import torch.distributed as dist
from fakes import fake_group, needs_nccl_path, opts, settle
from torch import nn
from torch._C._distributed_c10d import AllreduceOptions

FOUND = "was written while the op was in flight"


def checked_group():
    return dist.new_group(
        backend="streamnccl", pg_options=streamnccl.Options(check_inflight_writes=True)
    )


@contextlib.contextmanager
def captured_stderr(into):
    """What the process writes to its stderr (file descriptor 2, where C++ logs go) meanwhile,
    appended to `into` at the end."""
    with tempfile.TemporaryFile() as file:
        saved = os.dup(2)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            file.seek(0)
            into.append(file.read().decode(errors="replace"))


def wait_and_report(work):
    """The type and text of what wait() raised, or None."""
    try:
        work.wait()
    except Exception as error:  # noqa: BLE001 (its type is what the test checks)
        return type(error).__name__, str(error)
    return None


# --- the host path


def _a_write_in_flight_raises_at_wait(ctx):
    group = checked_group()
    x = torch.ones(4)
    launched_at = x._version
    work = dist.all_reduce(x, group=group, async_op=True)
    if ctx.rank == 0:
        x.add_(1)  # before wait(): the race
    raised = wait_and_report(work)
    # The op's result is there, and the group goes on.
    y = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(y, group=group)
    dist.destroy_process_group(group)
    return raised, launched_at, y.tolist()


def test_a_write_in_flight_raises_at_wait_on_the_host_path(rank_pools):
    results = rank_pools(2).run(_a_write_in_flight_raises_at_wait)
    (kind, message), launched_at, after = results[0]
    assert kind == "RuntimeError"  # the caller's error: not a DistBackendError, nothing broke
    assert "[streamnccl rank 0/2 pg=" in message
    assert "allreduce #1 ([4], Float)" in message
    assert f"argument `tensors[0]` {FOUND}" in message
    assert f"(version {launched_at} at launch, {launched_at + 1} at wait())" in message
    assert "wait() on the op's Work before writing its tensors" in message
    assert results[1][0] is None  # rank 1 wrote nothing
    assert after == [3.0] * 3 and results[1][2] == [3.0] * 3


def _no_false_alarm(ctx):
    group = checked_group()
    n, me = ctx.world_size, ctx.rank
    raised, logs = [], []
    with captured_stderr(logs):
        # AVG on the host is a SUM, then a division of the tensor by the op itself; two in a
        # row on one tensor, waited for after both: the second's division is the group's own.
        x = torch.full((5,), float(me + 1))
        first = dist.all_reduce(x, op=dist.ReduceOp.AVG, group=group, async_op=True)
        second = dist.all_reduce(x, op=dist.ReduceOp.AVG, group=group, async_op=True)
        raised += [wait_and_report(first), wait_and_report(second)]
        assert torch.equal(x, torch.full((5,), (n + 1) / 2))
        # Not contiguous: the op computes in a copy and copies the result back.
        t = torch.arange(12.0).reshape(3, 4).t()
        raised.append(wait_and_report(dist.all_reduce(t, group=group, async_op=True)))
        assert torch.equal(t, torch.arange(12.0).reshape(3, 4).t() * n)
        # FSDP2's all_gather: the input is a view of the output (one version counter).
        out = torch.zeros(3 * n)
        mine = out.narrow(0, 3 * me, 3)
        mine.fill_(float(me))
        work = dist.all_gather_into_tensor(out, mine, group=group, async_op=True)
        raised.append(wait_and_report(work))
        assert out.tolist() == [float(r) for r in range(n) for _ in range(3)]
        # Copies into a list of outputs; a reduce_scatter; a recv's copy into a view.
        parts = [torch.empty(2) for _ in range(n)]
        gathered = dist.all_gather(parts, torch.full((2,), float(me)), group=group, async_op=True)
        raised.append(wait_and_report(gathered))
        part = torch.empty(2)
        work = dist.reduce_scatter(part, [torch.ones(2)] * n, group=group, async_op=True)
        raised.append(wait_and_report(work))
        assert part.tolist() == [float(n)] * 2
        buffer = torch.zeros(2, 3)
        peer = 1 - me
        ops = [
            dist.P2POp(dist.isend, torch.full((3,), float(me)), peer, group),
            dist.P2POp(dist.irecv, buffer[1], peer, group),
        ]
        raised += [wait_and_report(w) for w in dist.batch_isend_irecv(ops)]
        assert buffer[1].tolist() == [float(peer)] * 3
        # A write to another tensor meanwhile is no race.
        y = torch.ones(2)
        work = dist.all_reduce(x, group=group, async_op=True)
        y.add_(1)
        raised.append(wait_and_report(work))
        # A write once the op was seen complete, before wait(): through is_completed(), or
        # the future.
        work = dist.all_reduce(x, group=group, async_op=True)
        while not work.is_completed():
            pass
        x.add_(1)
        raised.append(wait_and_report(work))
        work = dist.all_reduce(x, group=group, async_op=True)
        work.get_future().wait()
        x.add_(1)
        raised.append(wait_and_report(work))
        # A DDP comm hook's then() writes the result once the op has completed; its Work is
        # never waited for.
        z = torch.ones(3)
        dist.all_reduce(z, group=group, async_op=True).get_future().then(
            lambda f: f.value()[0].div_(n)
        ).wait()
        assert z.tolist() == [1.0] * 3
        streamnccl.stats(group)  # lets go of every Work that has ended
        dist.destroy_process_group(group)
    return raised, logs[0]


def test_no_false_alarm_on_the_host_path(rank_pools):
    for raised, log in rank_pools(2).run(_no_false_alarm):
        assert raised == [None] * len(raised)
        assert FOUND not in log, log


def _never_waited_ops_are_logged_once(ctx):
    group = checked_group()
    logs = []
    with captured_stderr(logs):
        for _ in range(2):
            x = torch.ones(4)
            if ctx.rank == 1:  # rank 0's op cannot complete before rank 1 joins it
                dist.barrier(group=ctx.gloo)
            dist.all_reduce(x, group=group, async_op=True)  # its Work dropped at once
            if ctx.rank == 0:
                x.add_(1)
                dist.barrier(group=ctx.gloo)
        dist.all_reduce(torch.ones(1), group=group)  # after both, in the group's order
        streamnccl.stats(group)  # lets go of their Works, which logs
        dist.destroy_process_group(group)
    return logs[0]


def test_never_waited_ops_are_logged_once_per_group(rank_pools):
    written, clean = rank_pools(2).run(_never_waited_ops_are_logged_once)
    assert written.count(FOUND) == 1, written
    assert "allreduce #1 ([4], Float): argument `tensors[0]`" in written
    assert "at completion" in written and "the op was never waited for" in written
    assert FOUND not in clean, clean


def _unchecked(ctx, group):
    x = torch.ones(4)
    work = dist.all_reduce(x, group=group, async_op=True)
    x.add_(1)
    raised = wait_and_report(work)
    options = group._get_backend(torch.device("cpu")).streamnccl_options
    return raised, options.check_inflight_writes


def _off_by_default(ctx):
    return _unchecked(ctx, dist.group.WORLD)


def test_off_by_default(rank_pools):
    for raised, switched_on in rank_pools(2).run(_off_by_default):
        assert raised is None and switched_on is False


def _the_environment_switches_it_on(ctx):
    os.environ["STREAMNCCL_CHECK_INFLIGHT_WRITES"] = "1"
    try:
        group = dist.new_group(backend="streamnccl")
    finally:
        del os.environ["STREAMNCCL_CHECK_INFLIGHT_WRITES"]
    x = torch.ones(4)
    work = dist.all_reduce(x, group=group, async_op=True)
    x.add_(1)
    raised = wait_and_report(work)
    dist.destroy_process_group(group)
    return raised


def test_the_environment_variable_switches_it_on(rank_pools):
    for kind, message in rank_pools(2).run(_the_environment_switches_it_on):
        assert kind == "RuntimeError" and FOUND in message


def test_the_option_is_read_from_the_environment_and_an_explicit_value_wins(monkeypatch):
    monkeypatch.delenv("STREAMNCCL_CHECK_INFLIGHT_WRITES", raising=False)
    assert streamnccl.Options().resolved().check_inflight_writes is False
    monkeypatch.setenv("STREAMNCCL_CHECK_INFLIGHT_WRITES", "1")
    assert streamnccl.Options().resolved().check_inflight_writes is True
    assert streamnccl.Options(check_inflight_writes=False).resolved().check_inflight_writes is False


# --- the NCCL path, over the fake GPU


@needs_nccl_path
def test_a_write_in_flight_raises_at_wait_on_the_nccl_path():
    pg, gpu = fake_group(check_inflight_writes=True)
    x = torch.ones(8)
    work = pg.allreduce([x], opts(AllreduceOptions))
    x.add_(1)  # on the caller's stream while the op runs on the internal one
    with pytest.raises(RuntimeError, match=f"allreduce #1 .*`tensors\\[0\\]` {FOUND}") as raised:
        work.wait()
    assert not isinstance(raised.value, dist.DistBackendError)
    assert "(version 0 at launch, 1 at wait())" in str(raised.value)
    # The group goes on; the same op without the write passes.
    y = torch.ones(4)
    pg.allreduce([y], opts(AllreduceOptions)).wait()
    gpu.synchronize()
    assert y.tolist() == [3.0] * 4  # its peers are mirrors of it
    assert settle(gpu) == []


@needs_nccl_path
@pytest.mark.parametrize("aten_kernels", [True, False])
def test_the_ops_own_kernels_are_not_flagged_on_the_nccl_path(aten_kernels):
    # The copy back into a non-contiguous tensor. With the fake's ATen kernels off, they run at
    # once on the caller's thread (out of order with the NCCL kernel: values are not checked),
    # bumping the version at issue as CUDA's do.
    pg, gpu = fake_group(check_inflight_writes=True, models={"aten_kernels": aten_kernels})
    t = torch.arange(12.0).reshape(3, 4).t()
    before = t._version
    pg.allreduce([t], opts(AllreduceOptions)).wait()
    gpu.synchronize()
    if aten_kernels:
        assert torch.equal(t, torch.arange(12.0).reshape(3, 4).t() * 3)
    else:
        assert t._version > before  # the copy-back: the group's own write
    assert settle(gpu) == []


@needs_nccl_path
def test_off_by_default_on_the_nccl_path():
    pg, gpu = fake_group()
    x = torch.ones(8)
    work = pg.allreduce([x], opts(AllreduceOptions))
    x.add_(1)
    work.wait()
    assert settle(gpu) == []


# --- no false positives: DDP and FSDP2 (the examples: test_examples.py)


def _ddp_steps(ctx, hook):
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = checked_group()
    logs = []
    with captured_stderr(logs):
        torch.manual_seed(0)
        model = DDP(
            nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)), process_group=group
        )
        if hook:

            def average_in_then(_, bucket):  # the result is written in then()
                fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
                return fut.then(lambda f: f.value()[0].div_(ctx.world_size))

            model.register_comm_hook(None, average_in_then)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = ctx.seed(7)
        for _ in range(4):
            loss = model(torch.randn(4, 8, generator=gen)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        streamnccl.stats(group)
        dist.destroy_process_group(group)
    return logs[0]


@pytest.mark.parametrize("hook", [False, True], ids=["default", "then_hook"])
def test_ddp_runs_clean(rank_pools, hook):
    for log in rank_pools(2).run(_ddp_steps, hook):
        assert FOUND not in log, log


def _fsdp2_steps(ctx, async_unshard):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    group = checked_group()
    logs = []
    with captured_stderr(logs):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # On CPU FSDP2 all-gathers with async_op=False unless asked to: then each all-gather's
        # input is a view of its output, waited for before use.
        model._set_unshard_async_op(async_unshard)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = ctx.seed(7)
        losses = []
        for _ in range(3):
            loss = model(torch.randn(4, 8, generator=gen)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        streamnccl.stats(group)
        dist.destroy_process_group(group)
    return logs[0], losses


@pytest.mark.parametrize("async_unshard", [False, True])
def test_fsdp2_runs_clean(rank_pools, async_unshard):
    for log, losses in rank_pools(2).run(_fsdp2_steps, async_unshard):
        assert FOUND not in log, log
        assert len(losses) == 3
