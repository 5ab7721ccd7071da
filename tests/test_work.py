"""The Work API on the host path: wait(), wait(timeout), is_completed(), get_future() and its
then() callbacks, result(), and the DistBackendError a timed-out wait raises."""

import threading
import time
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist
from collective_helpers import call_keeping_the_gil_until_it_blocks

pytestmark = pytest.mark.torch_internals  # streamnccl's Work as a subclass of torch's, in Python

WORLD_SIZES = [2, 3]


def _future_value_is_the_output_list(ctx):
    x = torch.full((4,), float(ctx.rank + 1))
    work = dist.all_reduce(x, async_op=True)
    value = work.get_future().wait()
    total = float(sum(range(1, ctx.world_size + 1)))
    assert isinstance(value, list) and len(value) == 1
    assert value[0] is x or torch.equal(value[0], x)
    assert torch.equal(value[0], torch.full((4,), total))
    # The future is marked inside the op; its end event passes a moment later on the worker.
    work.wait()
    assert work.is_completed()
    assert [t.data_ptr() for t in work.result()] == [x.data_ptr()]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_future_value_is_the_output_list(rank_pools, world_size):
    rank_pools(world_size).run(_future_value_is_the_output_list)


def _future_then_runs_after_the_op(ctx):
    # A DDP-style comm hook: divide the summed tensor in a then() callback.
    x = torch.full((8,), 2.0)
    fut = dist.all_reduce(x, async_op=True).get_future()
    averaged = fut.then(lambda f: f.value()[0] / ctx.world_size).wait()
    assert torch.equal(averaged, torch.full((8,), 2.0))
    # Futures of list allgather carry the output list.
    outputs = [torch.empty(2) for _ in range(ctx.world_size)]
    fut = dist.all_gather(outputs, torch.full((2,), float(ctx.rank)), async_op=True).get_future()
    gathered = fut.wait()
    assert [t.tolist() for t in gathered] == [[float(r)] * 2 for r in range(ctx.world_size)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_future_then_runs_after_the_op(rank_pools, world_size):
    rank_pools(world_size).run(_future_then_runs_after_the_op)


def _callbacks_see_finished_outputs(ctx):
    # A comm hook attached before the op has run is called the moment its future completes,
    # so the future must complete after the op's finish: the copy into a list of outputs,
    # the copy back into a non-contiguous tensor, AVG's division (SUM, then divide, here).
    n, me = ctx.world_size, ctx.rank
    first = torch.ones(1)
    if me != 0:  # rank 0's worker waits in this op until the others arrive
        dist.barrier(group=ctx.gloo)
    held_up = dist.all_reduce(first, async_op=True)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (me + 1)  # not contiguous
    outputs = [torch.zeros(2) for _ in range(n)]
    seen = {}
    avg = dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True)
    gather = dist.all_gather(outputs, torch.full((2,), float(me)), async_op=True)
    avg.get_future().then(lambda f: seen.__setitem__("avg", f.value()[0].clone()))
    gather.get_future().then(lambda f: seen.__setitem__("gather", [t.clone() for t in f.value()]))
    if me == 0:
        dist.barrier(group=ctx.gloo)  # only now may the others arrive
    for work in (held_up, avg, gather):
        work.wait()
    mean = sum(r + 1 for r in range(n)) / n
    assert torch.equal(seen["avg"], torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * mean)
    assert [t.tolist() for t in seen["gather"]] == [[float(r)] * 2 for r in range(n)]
    return True


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_callbacks_see_the_finished_outputs(rank_pools, world_size):
    assert rank_pools(world_size).run(_callbacks_see_finished_outputs) == [True] * world_size


def _sync_work_is_complete_at_return(ctx):
    x = torch.ones(3)
    work = dist.distributed_c10d._get_default_group().allreduce([x])
    work.wait()
    assert work.is_completed()
    assert torch.equal(x, torch.full((3,), float(ctx.world_size)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_sync_work_is_complete_at_return(rank_pools, world_size):
    rank_pools(world_size).run(_sync_work_is_complete_at_return)


def _is_completed_does_not_block_and_wait_timeout_raises(ctx):
    # The last rank joins 2 s late: the others see an incomplete op, and wait(timeout) raises
    # a DistBackendError naming the op. That breaks their group, as the watchdog's deadline
    # would (the ranks are no longer known to be in step): the op fails from then on, and so
    # does every later call on the group. Other groups go on. Without propagation, which would
    # break the late rank's group too (tests/test_propagation.py): this is the waiter's own.
    group = dist.new_group(
        backend="streamnccl", pg_options=streamnccl.Options(propagate_errors=False)
    )
    # Every rank opens the group's host path (Gloo, made at the first CPU op) first, so that
    # the ops below go straight into Gloo; one still waiting for a late rank to open would be
    # ended by the group breaking, outside Gloo.
    dist.all_reduce(torch.zeros(1), group=group)
    late = ctx.world_size - 1
    x = torch.full((5,), float(ctx.rank))
    if ctx.rank == late:
        time.sleep(2.0)
    work = dist.all_reduce(x, group=group, async_op=True)
    if ctx.rank != late:
        start = time.monotonic()
        assert not work.is_completed()
        assert time.monotonic() - start < 0.5, "is_completed() must not block"
        with pytest.raises(dist.DistBackendError) as error:
            work.wait(timeout=timedelta(milliseconds=300))
        message = str(error.value)
        assert f"[streamnccl rank {ctx.rank}/{ctx.world_size} pg=" in message
        assert "allreduce #" in message and "([5], Float)" in message
        assert "not completed within the timeout of 300 ms" in message
        with pytest.raises(dist.DistBackendError, match="the group broke: .*300 ms"):
            work.wait()
        with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
            dist.all_reduce(torch.ones(2), group=group)
    else:
        # Its peers' ops were already inside Gloo when they broke their groups: this one
        # completes, with the sum.
        assert work.wait()
        assert torch.equal(x, torch.full((5,), float(sum(range(ctx.world_size)))))
    dist.destroy_process_group(group)
    y = torch.ones(2)
    dist.all_reduce(y)
    assert torch.equal(y, torch.full((2,), float(ctx.world_size)))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_wait_with_timeout_raises_dist_backend_error(rank_pools, world_size):
    rank_pools(world_size).run(_is_completed_does_not_block_and_wait_timeout_raises)


def _sequence_numbers_count_ops(ctx):
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    before = backend._get_sequence_number_for_group()
    works = [dist.all_reduce(torch.ones(1), async_op=True) for _ in range(3)]
    for work in works:
        work.wait()
    assert backend._get_sequence_number_for_group() == before + 3


@pytest.mark.parametrize("world_size", [2])
def test_sequence_numbers_count_ops(rank_pools, world_size):
    rank_pools(world_size).run(_sequence_numbers_count_ops)


def _dropped_async_work_still_completes(ctx):
    # The caller drops the Work and the tensor at once; the op must still run correctly and
    # later ops must see its effect in order.
    x = torch.ones(100_000)
    dist.all_reduce(x, async_op=True)
    keep = x
    del x
    y = torch.ones(1)
    dist.all_reduce(y)
    assert torch.equal(keep, torch.full((100_000,), float(ctx.world_size)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_dropped_async_work_still_completes(rank_pools, world_size):
    rank_pools(world_size).run(_dropped_async_work_still_completes)


def _blocking_wait_option(ctx):
    import streamnccl

    options = streamnccl.Options(blocking_wait=True)
    group = dist.new_group(backend="streamnccl", pg_options=options)
    backend = group._get_backend(torch.device("cpu"))
    assert backend.streamnccl_options.blocking_wait is True
    x = torch.ones(3)
    dist.all_reduce(x, group=group, async_op=True).wait()
    assert torch.equal(x, torch.full((3,), float(ctx.world_size)))
    dist.destroy_process_group(group)


@pytest.mark.parametrize("world_size", [2])
def test_pg_options_reach_the_backend(rank_pools, world_size):
    rank_pools(world_size).run(_blocking_wait_option)


def _sync_op_inside_a_future_callback(ctx):
    # On the host path then() callbacks run on the group's worker; a sync collective issued
    # there must not wait for the worker itself.
    x = torch.ones(4)

    def second_round(fut):
        y = fut.value()[0].clone()
        dist.all_reduce(y)
        return y

    result = dist.all_reduce(x, async_op=True).get_future().then(second_round).wait()
    assert torch.equal(result, torch.full((4,), float(ctx.world_size**2)))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_sync_op_inside_a_future_callback(rank_pools, world_size):
    rank_pools(world_size).run(_sync_op_inside_a_future_callback, timeout=30)


def _a_blocking_wait_lets_other_python_threads_run(ctx):
    # The op on rank 0 can end only once a Python thread of rank 0 lets the others in; that
    # thread is released just before wait() and needs the GIL to go on. A wait() that kept the
    # GIL while it blocks (only one that returns at once may) would wait for it forever.
    x = torch.full((3,), float(ctx.rank + 1))
    if ctx.rank != 0:
        dist.barrier(group=ctx.gloo)  # until rank 0's thread lets them in
        dist.all_reduce(x)
    else:
        work = dist.all_reduce(x, async_op=True)
        about_to_wait = threading.Event()

        def let_the_others_in():
            about_to_wait.wait()
            dist.barrier(group=ctx.gloo)

        helper = threading.Thread(target=let_the_others_in)
        helper.start()
        assert call_keeping_the_gil_until_it_blocks(work.wait, about_to_wait)
        helper.join()
    total = float(sum(range(1, ctx.world_size + 1)))
    assert torch.equal(x, torch.full((3,), total))
    dist.all_reduce(x)  # sync: its wait(), which keeps the GIL, still sees the op through
    assert torch.equal(x, torch.full((3,), total * ctx.world_size))


@pytest.mark.parametrize("world_size", [2])
def test_a_blocking_wait_lets_other_python_threads_run(rank_pools, world_size):
    rank_pools(world_size).run(_a_blocking_wait_lets_other_python_threads_run, timeout=30)


def _a_waited_op_leaves_torchs_registry_of_ops_in_flight(ctx):
    # Under this context c10d registers every op's Work with its output, for torch.compile to
    # wait on; a wait() or synchronize() of the Work takes it out again, as ProcessGroupNCCL's.
    from torch.distributed._functional_collectives import (
        allow_inflight_collective_as_graph_input_ctx,
    )

    registry_size = torch._C._distributed_c10d._get_work_registry_size
    x = torch.full((4,), float(ctx.rank + 1))
    with allow_inflight_collective_as_graph_input_ctx():
        before = registry_size()
        waited = dist.all_reduce(x, async_op=True)
        synchronized = dist.all_reduce(x, async_op=True)
        assert registry_size() == before + 2
        waited.wait()
        synchronized.synchronize()
        assert registry_size() == before
    total = float(sum(range(1, ctx.world_size + 1)))
    assert torch.equal(x, torch.full((4,), total * ctx.world_size))


@pytest.mark.parametrize("world_size", [2])
def test_a_waited_op_leaves_torchs_registry_of_ops_in_flight(rank_pools, world_size):
    rank_pools(world_size).run(_a_waited_op_leaves_torchs_registry_of_ops_in_flight)
