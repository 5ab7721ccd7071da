"""c10d's completion hooks (torch's `_register_on_completion_hook`), `_wait_for_pending_works`
and `_enable_collectives_timing` on streamnccl groups: a hook hears of every completed op once,
in order, with its duration, on a thread of its own; a hook that raises is logged, and the
group goes on."""

import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def _backend(group):
    return group._get_backend(torch.device("cpu"))


def _ddp_with_a_recording_hook(ctx):
    group = dist.new_group(backend="streamnccl")
    heard, threads = [], set()

    def record(info):
        threads.add(threading.get_ident())
        heard.append((info.op_type, info.seq, info.active_duration.total_seconds(),
                      info.time_finished >= info.time_started))  # fmt: skip

    group._register_on_completion_hook(record)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model = DistributedDataParallel(module, process_group=group, bucket_cap_mb=0.0001)
    for step in range(3):
        inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(step + ctx.rank))
        model(inputs).sum().backward()
    group._wait_for_pending_works()
    issued = _backend(
        group
    )._get_sequence_number_for_group()  # 2.11: not on the group for custom backends
    dist.destroy_process_group(group)
    return heard, issued, threading.get_ident() in threads


def test_a_hook_hears_of_every_op_of_ddp_once_in_order_with_durations(rank_pools):
    for heard, issued, on_callers_thread in rank_pools(2).run(_ddp_with_a_recording_hook):
        assert issued > 3  # DDP's broadcast of the parameters, then buckets of gradients
        assert [seq for _, seq, _, _ in heard] == list(range(1, issued + 1)), heard
        assert all(duration > 0 for _, _, duration, _ in heard), heard
        assert all(ordered for _, _, _, ordered in heard), heard
        assert {str(op) for op, _, _, _ in heard} >= {"OpType.BROADCAST", "OpType.ALLREDUCE"}
        assert not on_callers_thread


def _a_hook_that_raises(ctx):
    group = dist.new_group(backend="streamnccl")
    calls = []

    def broken(info):
        calls.append(info.seq)
        raise ValueError("a monitoring bug")

    group._register_on_completion_hook(broken)
    results = []
    for i in range(3):
        x = torch.full((4,), float(ctx.rank + i))
        dist.all_reduce(x, group=group)
        results.append(x.tolist())
    group._wait_for_pending_works()
    error = _backend(group).get_error().name
    dist.destroy_process_group(group)
    return results, calls, error


def test_a_hook_that_raises_is_logged_and_the_group_goes_on(rank_pools):
    for results, calls, error in rank_pools(2).run(_a_hook_that_raises):
        assert results == [[float(1 + 2 * i)] * 4 for i in range(3)]
        assert calls == [1, 2, 3]
        assert error == "SUCCESS"


def _timing_enabled_later(ctx):
    group = dist.new_group(backend="streamnccl")
    untimed = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    untimed.wait()
    group._enable_collectives_timing()
    timed = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    timed.wait()
    try:
        untimed._get_duration()
        untimed_raised = False
    except ValueError:  # streamnccl: timing was off for it
        untimed_raised = True
    duration = timed._get_duration()
    dist.destroy_process_group(group)
    return untimed_raised, duration


def test_collectives_timing_enabled_later_times_the_ops_after(rank_pools):
    for untimed_raised, duration in rank_pools(2).run(_timing_enabled_later):
        assert untimed_raised
        assert duration > 0
