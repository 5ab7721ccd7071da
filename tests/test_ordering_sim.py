"""The stream contract, checked without a GPU.

A simulated device (csrc/sim/) runs the real core over the host communicator, but every one
of its streams, the caller's included, is an executor that runs each task after a random
delay. The test's own writes and reads go on the caller's stream too, as kernels would on
CUDA, so an op that skipped a dependency would see stale data or hand back a result too early.
Each check runs over SCHEDULES seeded schedules, and a mutation (events that never make a
stream wait, as if the core inserted no dependencies) shows the checks catch that bug.
"""

import itertools
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from conftest import TIMEOUT_S
from streamnccl import _testing
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    BroadcastOptions,
)

SCHEDULES = 200
MAX_DELAY_US = 200
WORLD_SIZES = [2, 3]
READ_TIMEOUT = timedelta(seconds=TIMEOUT_S)
STALE = -1000.0  # what a tensor holds before the caller's stream writes it

_groups_made = itertools.count()  # every rank makes its simulated groups in the same order


def simulated_group(ctx, drop_dependencies=False):
    """A simulated device and a streamnccl group on it, over a fresh Gloo group."""
    prefix = f"streamnccl-sim/{next(_groups_made)}/"
    store = dist.PrefixStore(prefix, dist.distributed_c10d._get_default_store())
    timeout = timedelta(seconds=TIMEOUT_S)
    gloo = dist.ProcessGroupGloo(store, ctx.rank, ctx.world_size, timeout)
    sim = _testing.SimulatedDevice(
        seed=ctx.rank, max_delay_us=MAX_DELAY_US, drop_dependencies=drop_dependencies
    )
    return sim, sim.process_group(ctx.rank, ctx.world_size, timeout, gloo)


def with_async(opts, async_op):
    opts.asyncOp = async_op
    return opts


# Each op kind: run(ctx, sim, pg, s, async_op) enqueues its inputs on the caller's stream,
# launches the op, waits as torch.distributed does, reads the outputs on the caller's stream
# and returns (observed, expected) tensors.


def run_single_tensor(ctx, sim, pg, s, async_op):
    x = torch.full((4,), STALE)
    sim.write(x, torch.full((4,), float(ctx.rank + s)))
    pg.allreduce([x], with_async(AllreduceOptions(), async_op)).wait()
    total = float(sum(r + s for r in range(ctx.world_size)))
    return sim.read(x).value(READ_TIMEOUT), torch.full((4,), total)


def run_list(ctx, sim, pg, s, async_op):
    n = ctx.world_size
    x = torch.full((3,), STALE)
    outputs = [torch.full((3,), STALE) for _ in range(n)]
    sim.write(x, torch.full((3,), float(10 * ctx.rank + s)))
    pg.allgather([outputs], [x], with_async(AllgatherOptions(), async_op)).wait()
    observed = torch.cat([sim.read(out).value(READ_TIMEOUT) for out in outputs])
    expected = torch.cat([torch.full((3,), float(10 * r + s)) for r in range(n)])
    return observed, expected


def run_coalesced(ctx, sim, pg, s, async_op):
    a, b = torch.full((2,), STALE), torch.full((5,), STALE)
    sim.write(a, torch.full((2,), float(ctx.rank + s)))
    sim.write(b, torch.full((5,), float(2 * ctx.rank)))
    pg.allreduce_coalesced([a, b], with_async(AllreduceCoalescedOptions(), async_op)).wait()
    n = ctx.world_size
    observed = torch.cat([sim.read(a).value(READ_TIMEOUT), sim.read(b).value(READ_TIMEOUT)])
    expected = torch.cat(
        [
            torch.full((2,), float(sum(r + s for r in range(n)))),
            torch.full((5,), float(sum(2 * r for r in range(n)))),
        ]
    )
    return observed, expected


def run_point_to_point(ctx, sim, pg, s, async_op):
    # Around a ring, recv posted first; c10d's send and recv are always async.
    n, me = ctx.world_size, ctx.rank
    x, inbox = torch.full((6,), STALE), torch.full((6,), STALE)
    sim.write(x, torch.full((6,), float(me + s)))
    recv = pg.recv([inbox], (me - 1) % n, 0)
    pg.send([x], (me + 1) % n, 0).wait()
    recv.wait()
    return sim.read(inbox).value(READ_TIMEOUT), torch.full((6,), float((me - 1) % n + s))


def run_future_callback(ctx, sim, pg, s, async_op):
    # A then() callback, as DDP comm hooks use, sees the op's result.
    x = torch.full((4,), STALE)
    sim.write(x, torch.full((4,), float(ctx.rank * s)))
    work = pg.allreduce([x], with_async(AllreduceOptions(), async_op))
    seen = work.get_future().then(lambda fut: fut.value()[0].clone())
    total = float(sum(r * s for r in range(ctx.world_size)))
    return seen.wait(), torch.full((4,), total)


OP_KINDS = {
    "single_tensor": run_single_tensor,
    "list": run_list,
    "coalesced": run_coalesced,
    "point_to_point": run_point_to_point,
    "future_callback": run_future_callback,
}


def _count_wrong_schedules(ctx, kind, async_op, drop_dependencies):
    sim, pg = simulated_group(ctx, drop_dependencies)
    wrong = 0
    for s in range(SCHEDULES):
        sim.reseed(s * 7919 + ctx.rank)
        observed, expected = OP_KINDS[kind](ctx, sim, pg, s, async_op)
        wrong += not torch.equal(observed, expected)
    sim.synchronize()
    return wrong


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", list(OP_KINDS))
def test_results_follow_the_callers_stream(rank_pools, world_size, kind, async_op):
    wrong = rank_pools(world_size).run(_count_wrong_schedules, kind, async_op, False)
    assert wrong == [0] * world_size, f"schedules with a wrong result, per rank: {wrong}"


# The mutation: each kind's async form, whose correctness rests on the inserted dependencies.
@pytest.mark.parametrize("kind", list(OP_KINDS))
def test_without_dependencies_the_checks_fail(rank_pools, kind):
    wrong = rank_pools(2).run(_count_wrong_schedules, kind, True, True)
    assert sum(wrong) > 0, f"{kind}: {SCHEDULES} schedules without dependencies all passed"


def _complete_in_program_order(ctx):
    sim, pg = simulated_group(ctx)
    for s in range(SCHEDULES):
        sim.reseed(s * 104729 + ctx.rank)
        completed = []
        works = []
        for k in range(4):
            x = torch.full((k + 1,), float(k))
            work = pg.allreduce([x], with_async(AllreduceOptions(), True))
            work.get_future().then(lambda _, k=k, done=completed: done.append(k))
            works.append(work)
        for work in works:
            work.wait()
        sim.synchronize()
        assert completed == sorted(completed), f"schedule {s}: completed in order {completed}"
        assert len(completed) == 4, f"schedule {s}: only {completed} completed"
    return True


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ops_complete_in_program_order(rank_pools, world_size):
    assert rank_pools(world_size).run(_complete_in_program_order) == [True] * world_size


def _stuck_op_times_out(ctx):
    # wait(timeout) on an op stuck past the timeout raises, and breaks the group as the
    # watchdog's deadline would: the ranks are no longer known to be in step. Only rank 0
    # issues the op, so no peer is left inside Gloo waiting for it.
    sim, pg = simulated_group(ctx)
    if ctx.rank != 0:
        return True
    sim.hold_internal_streams(True)
    work = pg.allreduce([torch.ones(3)], with_async(AllreduceOptions(), True))
    with pytest.raises(dist.DistBackendError, match="allreduce #1 .*within the timeout of 200 ms"):
        work.wait(timedelta(milliseconds=200))
    with pytest.raises(dist.DistBackendError, match="the group broke: .*within the timeout"):
        work.wait()
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
        pg.allreduce([torch.ones(3)], with_async(AllreduceOptions(), True))
    sim.hold_internal_streams(False)  # the stuck op now runs, and finds its communicator aborted
    return True


def test_wait_with_timeout_on_a_stuck_op_raises_and_breaks_the_group(rank_pools):
    assert rank_pools(2).run(_stuck_op_times_out) == [True, True]


def _dropped_tensors_live_until_done(ctx):
    # Senders drop every reference to what they send right after the call, then take memory
    # of the same size, which the pool hands back at once if it was released, and scribble
    # on it. A receiver still sees what was sent: the memory stayed with the op.
    sim, pg = simulated_group(ctx)
    n, me = ctx.world_size, ctx.rank
    for s in range(SCHEDULES):
        sim.reseed(s * 15485863 + me)
        x = sim.empty(8)
        sim.write(x, torch.full((8,), float(s)))
        work = pg.broadcast([x], with_async(BroadcastOptions(), True))  # root 0
        if me == 0:
            del x
            scribble = sim.empty(8)
            sim.write(scribble, torch.full((8,), -1.0))
            del scribble
            work.wait()
        else:
            work.wait()
            assert torch.equal(sim.read(x).value(READ_TIMEOUT), torch.full((8,), float(s)))
        y, inbox = sim.empty(16), sim.empty(16)
        sim.write(y, torch.full((16,), float(me + s)))
        sim.write(inbox, torch.zeros(16))
        recv = pg.recv([inbox], (me - 1) % n, 0)
        send = pg.send([y], (me + 1) % n, 0)
        del y
        sim.write(sim.empty(16), torch.full((16,), -1.0))
        send.wait()
        recv.wait()
        got = sim.read(inbox).value(READ_TIMEOUT)
        assert torch.equal(got, torch.full((16,), float((me - 1) % n + s))), f"schedule {s}"
    sim.synchronize()
    return sim.reuses


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_dropped_tensors_are_not_reused_before_completion(rank_pools, world_size):
    reuses = rank_pools(world_size).run(_dropped_tensors_live_until_done)
    # The check is only as good as the pool's recycling: memory did come back for reuse.
    assert all(count > 0 for count in reuses), reuses
