"""Teardown finishes what was issued: destroy_process_group() (and a group's shutdown()) waits
for every op in flight to complete before the communicators go, as gloo and the built-in nccl
do, so that no rank's result is lost; only a broken group, or a flush that runs past the
group's timeout, aborts instead, and the op left unfinished says so."""

import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

GROUP_TIMEOUT_S = 3


def _destroy_with_ops_in_flight(ctx, count):
    n, me = ctx.world_size, ctx.rank
    group = dist.new_group(backend="streamnccl")
    tensors = [torch.full((1000,), float(me + i)) for i in range(count)]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    # Point-to-point on the lanes too: a receive from the left, a send to the right.
    inbox = torch.zeros(4)
    dist.irecv(inbox, src=(me - 1) % n, group=group)
    dist.isend(torch.full((4,), float(me)), (me + 1) % n, group=group)
    dist.destroy_process_group(group)  # no wait(): destroy must finish them
    for i, t in enumerate(tensors):
        assert torch.equal(t, torch.full((1000,), float(sum(r + i for r in range(n))))), i
    assert torch.equal(inbox, torch.full((4,), float((me - 1) % n)))
    assert all(work.is_completed() and work.is_success() for work in works)
    return True


@pytest.mark.parametrize("world_size", [2, 3])
def test_destroy_finishes_the_ops_in_flight(rank_pools, world_size):
    assert rank_pools(world_size).run(_destroy_with_ops_in_flight, 8) == [True] * world_size


def _shutdown_with_ops_in_flight(ctx):
    n, me = ctx.world_size, ctx.rank
    group = dist.new_group(backend="streamnccl")
    x = torch.full((16,), float(me))
    dist.all_reduce(x, group=group, async_op=True)
    group._get_backend(torch.device("cpu")).shutdown()  # what destroy_process_group calls
    assert torch.equal(x, torch.full((16,), float(sum(range(n)))))
    with pytest.raises(dist.DistBackendError, match="allreduce: the group was shut down"):
        dist.all_reduce(x, group=group)
    dist.destroy_process_group(group)  # shutting down again does nothing
    return True


@pytest.mark.parametrize("world_size", [2])
def test_shutdown_finishes_the_ops_in_flight_and_then_refuses_ops(rank_pools, world_size):
    assert rank_pools(world_size).run(_shutdown_with_ops_in_flight) == [True] * world_size


def _flush_past_the_timeout(ctx):
    me = ctx.rank
    group = dist.new_group(backend="streamnccl", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    x = torch.ones(4)
    dist.all_reduce(x, group=group)
    if me == 1:
        # Rank 0 never issues this one: the flush cannot finish it.
        unmatched = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    dist.barrier(group=ctx.gloo)  # rank 1's op is issued
    if me == 0:  # rank 0 keeps its side open (a live peer that never issues the op)
        dist.barrier(group=ctx.gloo)
    started = time.monotonic()
    try:
        dist.destroy_process_group(group)
        took = time.monotonic() - started
        if me == 1:
            # Whichever deadline comes first ends it: the op's own (the watchdog's, or Gloo's
            # in the host path), or the teardown's, counted from the destroy. (The teardown's
            # own message is pinned over the fake GPU, where the op's deadline can be later.)
            with pytest.raises(dist.DistBackendError, match=r"allreduce #2 \(\[4\], Float\)"):
                unmatched.wait()
    finally:
        if me == 1:
            dist.barrier(group=ctx.gloo)
    return took


@pytest.mark.slow
def test_a_flush_past_the_timeout_aborts_and_says_which_op(rank_pools):
    took = rank_pools(2).run(_flush_past_the_timeout)
    assert took[0] < 2, took  # nothing of rank 0's was in flight
    assert GROUP_TIMEOUT_S - 1 < took[1] < GROUP_TIMEOUT_S + 5, took


# --- a group let go of, or shut down, on one of its own threads
#
# An op's future callback runs on the group's worker (the host path's internal stream) or,
# when the op fails, on its watchdog. A callback may hold the last reference to the group, or
# shut it down. The teardown waits for the group's ops and joins its threads: run there, it
# waited for the very thread it ran on (the op "timed out" after the group's timeout though
# it had completed, and the thread never came back). These run in a child process, two ranks
# of the host path in it, since the old failure left a thread stuck for good.

ASYNC_OPTIONS = """
    from torch._C._distributed_c10d import AllreduceOptions
    ASYNC = AllreduceOptions()
    ASYNC.asyncOp = True
"""


def two_host_groups(timeout, gloo_timeout=None):
    """Ranks 0 and 1 of a streamnccl group on the host path, both in this process; Gloo's own
    timeout is the group's unless given."""
    import threading

    import streamnccl

    store = dist.HashStore()
    groups = [None, None]

    def make(rank):  # Gloo's ranks connect to each other: made at once
        gloo = dist.ProcessGroupGloo(
            dist.PrefixStore("gloo/", store), rank, 2, gloo_timeout or timeout
        )
        options = streamnccl.Options()
        groups[rank] = streamnccl.ProcessGroup(store, rank, 2, timeout, options, gloo)

    makers = [threading.Thread(target=make, args=(rank,)) for rank in range(2)]
    for maker in makers:
        maker.start()
    for maker in makers:
        maker.join()
    return groups


def group_threads(with_ids=False):
    """The names of this process's threads that streamnccl's groups run (with their ids)."""
    import threads

    found = [(name, task) for task, name in threads.named().items()]
    found = [(name, task) for name, task in found if name.startswith("streamnccl")]
    return found if with_ids else [name for name, _ in found]


def until_group_threads_end():
    """The group threads still alive 30 s on: none, or each said with where it stands (its
    state, the kernel function it sleeps in and, where gdb is at hand, its stack), so that a
    thread that outlives its group is seen in the failing test's output."""
    deadline = time.monotonic() + 30
    while group_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    left = group_threads(with_ids=True)
    for name, task in left:
        print(f"left: {name} ({task}):", where_a_thread_stands(task))
    return [name for name, _ in left]


def where_a_thread_stands(task):
    import os
    import shutil
    import subprocess

    said = []
    for part in ("stat", "wchan", "syscall"):
        try:
            with open(f"/proc/self/task/{task}/{part}") as facts:
                said.append(f"{part}: {facts.read().strip()}")
        except OSError as error:
            said.append(f"{part}: {error}")
    if shutil.which("gdb"):
        stack = subprocess.run(
            ["gdb", "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt 30"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        frames = [line for line in stack.stdout.splitlines() if line.startswith(("Thread ", "#"))]
        said.append("\n".join(frames)[-20000:])
    return "\n".join(said)


def letting_go(holder):
    """A future callback that lets go of the group in `holder` (its last reference), and what
    it saw: the names of the threads it ran on, and an Event set once it returned."""
    import threading

    where, returned = [], threading.Event()

    def let_go(_):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as comm:
            where.append(comm.read().strip())
        holder.clear()
        returned.set()

    return let_go, where, returned


def run_child(scenario):
    import fakes

    return fakes.run_child("test_teardown", ASYNC_OPTIONS + scenario)


LET_GO_IN_A_CALLBACK = """
    import torch
    from datetime import timedelta
    # A timeout far past the child's: waiting for itself, the group would still be waiting.
    groups = t.two_host_groups(timedelta(seconds=300))
    x = [torch.ones(4), torch.ones(4)]
    future = groups[0].allreduce([x[0]], ASYNC).get_future()
    holder = [groups[0]]  # the last reference to rank 0's group, let go of on Gloo's thread
    groups[0] = None
    let_go, where, returned = t.letting_go(holder)
    future.then(let_go)
    groups[1].allreduce([x[1]], ASYNC).wait()  # rank 1 joins in: rank 0's op completes
    print("returned:", returned.wait(30), "on", where)
    future.wait()  # raises if the op was failed
    print("result:", x[0].tolist())
    groups[1].shutdown()
    groups = None
    print("threads left:", t.until_group_threads_end())
"""


def test_a_group_let_go_of_in_its_ops_callback_ends_without_waiting_for_itself():
    output = run_child(LET_GO_IN_A_CALLBACK)
    # No thread waits for rank 0's op: it completes on Gloo's thread (the host stream settles
    # it there); where its peer had not yet opened Gloo, on the stream's worker. Either way,
    # not on the caller's, which waits for rank 1's op on another stream.
    assert re.search(r"returned: True on \['(pt_gloo_runloop|streamnccl-host)'\]", output), output
    assert "result: [2.0, 2.0, 2.0, 2.0]" in output, output
    assert "threads left: []" in output, output


SHUT_DOWN_IN_A_CALLBACK = """
    import threading, torch
    from datetime import timedelta
    import torch.distributed as dist
    groups = t.two_host_groups(timedelta(seconds=300))
    x = [torch.ones(4), torch.ones(4)]
    future = groups[0].allreduce([x[0]], ASYNC).get_future()
    returned = threading.Event()

    def shut_down(_):
        groups[0].shutdown()  # as destroy_process_group() of a subgroup does
        returned.set()

    future.then(shut_down)
    groups[1].allreduce([x[1]], ASYNC).wait()
    print("returned:", returned.wait(30))
    future.wait()
    print("result:", x[0].tolist())
    try:
        groups[0].allreduce([x[0]], ASYNC)
    except dist.DistBackendError as error:
        print("later op:", "shut down" in str(error))
    groups[0].shutdown()  # again, from here: nothing left to do
    groups[1].shutdown()
    groups = None
    print("threads left:", t.until_group_threads_end())
"""


def test_a_group_shut_down_in_its_ops_callback_ends_without_waiting_for_itself():
    output = run_child(SHUT_DOWN_IN_A_CALLBACK)
    assert "returned: True" in output, output
    assert "result: [2.0, 2.0, 2.0, 2.0]" in output, output
    assert "later op: True" in output, output
    assert "threads left: []" in output, output


LET_GO_WHEN_THE_WATCHDOG_FAILS_ITS_OP = """
    import torch
    from datetime import timedelta
    # The watchdog's timeout comes first: Gloo's own would fail the op on the worker.
    groups = t.two_host_groups(timedelta(seconds=1), gloo_timeout=timedelta(seconds=300))
    future = groups[0].allreduce([torch.ones(4)], ASYNC).get_future()  # rank 1 never comes
    holder = [groups[0]]  # the last reference to rank 0's group, let go of on its watchdog
    groups[0] = None
    let_go, where, returned = t.letting_go(holder)
    future.then(let_go)
    print("returned:", returned.wait(30), "on", where)
    try:
        future.wait()
    except Exception as error:
        print("failed:", "timed out" in str(error))
    groups[1].shutdown()
    groups = None
    print("threads left:", t.until_group_threads_end())
"""


@pytest.mark.slow
def test_a_group_let_go_of_by_its_watchdog_ends_without_waiting_for_itself():
    output = run_child(LET_GO_WHEN_THE_WATCHDOG_FAILS_ITS_OP)
    assert "returned: True on ['streamnccl-wdog']" in output, output
    assert "failed: True" in output, output
    assert "threads left: []" in output, output


SHUT_DOWN_IN_A_CALLBACK_AND_ELSEWHERE = """
    import threading, torch
    from datetime import timedelta
    groups = t.two_host_groups(timedelta(seconds=300))
    x = [torch.ones(4), torch.ones(4)]
    future = groups[0].allreduce([x[0]], ASYNC).get_future()
    returned = threading.Event()

    def shut_down(_):
        groups[0].shutdown()
        returned.set()

    future.then(shut_down)
    # Another thread shuts rank 0's group down too, finishing its op first; whichever comes
    # first, the callback must not wait for that teardown, which waits for the callback.
    elsewhere = threading.Thread(target=groups[0].shutdown)
    elsewhere.start()
    groups[1].allreduce([x[1]], ASYNC).wait()
    print("returned:", returned.wait(30))
    elsewhere.join(30)
    print("shut down elsewhere:", not elsewhere.is_alive())
    print("result:", x[0].tolist())
    groups[1].shutdown()
    groups = None
    print("threads left:", t.until_group_threads_end())
"""


def test_a_group_shut_down_in_its_ops_callback_and_elsewhere_at_once_ends():
    output = run_child(SHUT_DOWN_IN_A_CALLBACK_AND_ELSEWHERE)
    assert "returned: True" in output, output
    assert "shut down elsewhere: True" in output, output
    assert "result: [2.0, 2.0, 2.0, 2.0]" in output, output
    assert "threads left: []" in output, output


EXIT_RIGHT_AFTER_LETTING_GO_IN_A_CALLBACK = """
    import torch
    from datetime import timedelta
    groups = t.two_host_groups(timedelta(seconds=300))
    future = groups[0].allreduce([torch.ones(4)], ASYNC).get_future()
    holder = [groups[0]]
    groups[0] = None
    let_go, _, returned = t.letting_go(holder)
    future.then(let_go)
    groups[1].allreduce([torch.ones(4)], ASYNC).wait()
    print("returned:", returned.wait(30))
    # The interpreter exits at once: its exit waits for the teardown running apart.
"""


def test_the_exit_waits_for_a_teardown_running_apart():
    output = run_child(EXIT_RIGHT_AFTER_LETTING_GO_IN_A_CALLBACK)  # the child exits with 0
    assert "returned: True" in output, output


EXIT_WHILE_THE_LAST_REFERENCE_IS_IN_A_CALLBACK = """
    import threading, torch
    from datetime import timedelta
    # Rank 1 never joins rank 0's op: the exit's teardown of rank 0's group waits for it,
    # and its failure, at the group's timeout, lets go of the group in its callback.
    groups = t.two_host_groups(timedelta(seconds=2), gloo_timeout=timedelta(seconds=300))
    future = groups[0].allreduce([torch.ones(4)], ASYNC).get_future()
    holder = [groups[0]]
    groups[0] = None

    def let_go(_):
        name = open(f"/proc/self/task/{threading.get_native_id()}/comm").read().strip()
        holder.clear()
        print("let go of on", name, flush=True)

    future.then(let_go)
    print("exiting", flush=True)
"""


@pytest.mark.slow
def test_the_exit_ends_when_a_callback_lets_go_of_a_group_it_is_closing():
    output = run_child(EXIT_WHILE_THE_LAST_REFERENCE_IS_IN_A_CALLBACK)  # the child exits with 0
    assert "exiting" in output, output
    assert "let go of on" in output, output
