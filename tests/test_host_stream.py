"""The host path's internal stream (csrc/host/HostStream.hpp): an async op posts its calls to
Gloo from its caller and completes from Gloo's side or in its waiter's wait(), so a group whose
ops post at once has no thread of its own; the ops of one stream still run in program order,
one after the other, as on a CUDA stream; a send or a receive is waited for by its caller's
wait(), else by the stream's named worker, and a break ends that wait at once."""

import sys
import time
from datetime import timedelta

import pytest
import streamnccl
import threads
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads thread states from /proc"
)


def threads_named(name):
    """{thread: voluntary context switches so far} of this process's threads called `name`."""
    found = {}
    for task, its_name in threads.named().items():
        if its_name != name:
            continue
        try:
            with open(f"/proc/self/task/{task}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        found[task] = int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return found


def test_a_group_whose_ops_post_at_once_starts_no_thread():
    # Sync ops run on their callers, and async ones post from them and complete on Gloo's
    # threads: with a thread per group, 64 subgroups would hold 64 idle threads.
    others = set(threads_named("streamnccl-host"))  # other tests' groups, in this process
    store = dist.HashStore()
    timeout = timedelta(seconds=60)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), 0, 1, timeout)
    group = streamnccl.ProcessGroup(store, 0, 1, timeout, streamnccl.Options(), gloo)
    x = torch.ones(4)
    for async_op in (False, True, False, True):
        options = AllreduceOptions()
        options.asyncOp = async_op
        group.allreduce([x], options).wait()
    works = []
    for _ in range(100):
        options = AllreduceOptions()
        options.asyncOp = True
        works.append(group.allreduce([x], options))
    for work in works:
        work.wait()
    assert torch.equal(x, torch.ones(4))
    assert set(threads_named("streamnccl-host")) <= others
    group.shutdown()
    del group


def _async_ops_in_program_order(ctx, numel):
    # A chain of async ops on one tensor, none waited for until the last: each reads what the
    # one before it wrote, so posted to Gloo before that one completed (Gloo runs its queue on
    # two threads at once) they would read a half-written tensor. Values in closed form.
    me, n = ctx.rank, ctx.world_size
    x = torch.full((numel,), float(me + 1))
    works = []
    for round_ in range(3):
        works.append(dist.all_reduce(x, async_op=True))  # every element: the sum of the ranks'
        works.append(dist.broadcast(x, src=round_ % n, async_op=True))  # unchanged: all equal
        works.append(dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True))
    works[-1].wait()
    # Starting from 1..n: n(n+1)/2, then times n at each later round's sum.
    expected = n * (n + 1) / 2 * n**2
    assert torch.equal(x, torch.full((numel,), expected)), (x[:4], expected)
    assert all(work.is_completed() for work in works)
    # A sync op after async ones still queued: posted after them on every rank, whichever
    # rank's stream is further on, so each exchange meets its own on the other ranks.
    a, b, c = (torch.full((numel,), float(me + k)) for k in (1, 10, 100))
    pending = [dist.all_reduce(a, async_op=True), dist.all_reduce(b, async_op=True)]
    dist.all_reduce(c)
    for work in pending:
        work.wait()
    for tensor, k in ((a, 1), (b, 10), (c, 100)):
        assert torch.equal(tensor, torch.full((numel,), float(sum(range(n)) + n * k)))


@pytest.mark.parametrize("numel", [1, 4 << 20])
def test_async_ops_of_one_stream_run_in_program_order(rank_pools, numel):
    rank_pools(2).run(_async_ops_in_program_order, numel)


def _future_callbacks_see_the_result(ctx, numel):
    # An op's future completes, and its then() callbacks run (DDP's comm hooks), once Gloo has
    # completed the op: a callback reading the tensor finds the sum, whichever thread runs it.
    me, n = ctx.rank, ctx.world_size
    seen = []
    for round_ in range(5):
        x = torch.full((numel,), float(me + round_))
        future = dist.all_reduce(x, async_op=True).get_future()
        seen.append(future.then(lambda done: done.value()[0].clone()))
    for round_, later in enumerate(seen):
        expected = float(sum(range(n)) + n * round_)
        assert torch.equal(later.wait(), torch.full((numel,), expected)), round_


def test_future_callbacks_see_the_result(rank_pools):
    rank_pools(2).run(_future_callbacks_see_the_result, 4 << 20)


def _waiters_complete_their_ops(ctx, rounds):
    # Who completes an op (HostStream::helpWait): two threads wait for two ops of one stream
    # at once, the second queued behind the first, so both park while Gloo's thread completes
    # the first call and posts the second; then an op alone, whose caller in wait() takes its
    # call over and completes it on its own thread (the call's future wakes it). Every fourth
    # round rank 1 comes 30 ms late to each, so rank 0's waits outlast their 10 ms slices: the
    # parked ones park again, the one alone gives its claim back. Results and callbacks in
    # closed form.
    import threading

    me, n = ctx.rank, ctx.world_size
    for round_ in range(rounds):
        a = torch.full((256,), float(me + round_))
        b = torch.full((256,), float(2 * me + round_))
        c = torch.full((256,), float(3 * me + round_))
        late = me == 1 and round_ % 4 == 0
        if late:
            time.sleep(0.03)  # not a wait for anything: rank 0's waits run long
        first = dist.all_reduce(a, async_op=True)
        second = dist.all_reduce(b, async_op=True)
        seen = second.get_future().then(lambda done: done.value()[0].clone())
        waited = []
        other = threading.Thread(target=lambda work, out: out.append(work.wait()),
                                 args=(second, waited))  # fmt: skip
        other.start()
        first.wait()
        other.join(timeout=60)
        assert waited == [True], (round_, waited)
        assert torch.equal(a, torch.full((256,), float(sum(range(n)) + n * round_))), round_
        expected_b = torch.full((256,), float(n * (n - 1) + n * round_))
        assert torch.equal(b, expected_b), round_
        assert torch.equal(seen.wait(), expected_b), round_
        if late:
            time.sleep(0.03)
        dist.all_reduce(c, async_op=True).wait()
        assert torch.equal(c, torch.full((256,), float(3 * sum(range(n)) + n * round_))), round_


def test_waiters_complete_their_ops(rank_pools):
    rank_pools(2).run(_waiters_complete_their_ops, 40)


def _a_waited_op_has_its_future_done(ctx, rounds):
    # An op's settle completes its future (waking DDP's reducer) before the stream sets the
    # op's end: a wait() that returns finds the op's future done, with the result, as with
    # gloo, whichever thread settled it. Waited three ways: by wait(),
    # which settles the op itself; by wait(timeout), which sleeps while Gloo's thread settles
    # it; and by the future alone, with a later op's wait() (which may settle both).
    me, n = ctx.rank, ctx.world_size
    for round_ in range(rounds):
        x = torch.full((64,), float(me + round_))
        work = dist.all_reduce(x, async_op=True)
        future = work.get_future()
        expected = torch.full((64,), float(sum(range(n)) + n * round_))
        if round_ % 3 == 0:
            work.wait()
        elif round_ % 3 == 1:
            work.wait(timedelta(seconds=60))
        else:
            dist.all_reduce(torch.ones(1), async_op=True).wait()
        assert future.done(), round_
        assert torch.equal(future.value()[0], expected), round_


def test_a_waited_op_has_its_future_done(rank_pools):
    rank_pools(2).run(_a_waited_op_has_its_future_done, 300)


def _sends_and_receives_waited_for_by_their_callers(ctx, ops):
    # A send or a recv has no future in Gloo: a thread must wait for it. Where its caller
    # calls wait(), the caller does, as with gloo; the lanes' workers (which ran each lane's
    # first op, its peer not yet known to have opened Gloo) sleep throughout. One wake of a
    # worker per op (the hand-off this guards against) doubles a small message's switches.
    me, peer = ctx.rank, 1 - ctx.rank
    x = torch.full((3,), 5.0)
    dist.send(x, dst=peer) if me == 0 else dist.recv(x, src=peer)  # opens both lanes
    dist.recv(x, src=peer) if me == 0 else dist.send(x, dst=peer)
    workers = threads_named("streamnccl-host")  # named, for py-spy, gdb and top
    assert workers, "no thread named streamnccl-host: the lanes' workers are not named"
    for i in range(ops):
        message = torch.full((3,), float(i))
        if me == 0:
            dist.send(message, dst=peer)
            dist.recv(x, src=peer)
        else:
            dist.recv(x, src=peer)
            dist.send(x, dst=peer)
        assert torch.equal(x, message) or me == 1
    after = threads_named("streamnccl-host")
    return sum(after[t] - workers[t] for t in workers if t in after)


def test_sends_and_receives_are_waited_for_by_their_callers(rank_pools):
    ops = 300
    woken = rank_pools(2).run(_sends_and_receives_waited_for_by_their_callers, ops)
    assert max(woken) < ops // 10, f"the lanes' workers woke {woken} times in {ops} round trips"


def _batches_only(ctx, ops):
    # A group whose only ops are batch_isend_irecv (each a coalesced group of a send and a
    # recv on the group's stream) learns at its first that every member has opened Gloo, and
    # posts the later ones from the caller: its worker, which ran the first, sleeps after.
    me, n = ctx.rank, ctx.world_size
    group = dist.new_group(backend="streamnccl")
    inbox = torch.empty(4)

    def batch(value):
        ops = [dist.P2POp(dist.isend, torch.full((4,), value + me), (me + 1) % n, group),
               dist.P2POp(dist.irecv, inbox, (me - 1) % n, group)]  # fmt: skip
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        assert torch.equal(inbox, torch.full((4,), value + (me - 1) % n))

    batch(0.0)
    workers = threads_named("streamnccl-host")
    for i in range(ops):
        batch(float(i))
    after = threads_named("streamnccl-host")
    dist.destroy_process_group(group)
    return sum(after[t] - workers[t] for t in workers if t in after)


def test_a_group_of_batches_alone_posts_them_from_the_caller(rank_pools):
    ops = 200
    woken = rank_pools(2).run(_batches_only, ops)
    assert max(woken) < ops // 10, f"the group's worker woke {woken} times in {ops} batches"


GROUP_TIMEOUT_S = 120


def _a_recv_nobody_sends(ctx):
    # Rank 0 waits for a message that rank 1 never sends. The group's abort ends that wait at
    # once (Gloo's abortWaitRecv), rather than at Gloo's timeout, minutes away: the recv
    # fails, and the group is destroyed at once.
    me = ctx.rank
    group = dist.new_group(backend="streamnccl", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    dist.all_reduce(torch.ones(1), group=group)
    result = None
    if me == 0:
        inbox = torch.zeros(4)
        work = dist.irecv(inbox, src=1, group=group)
        dist.send(torch.ones(4), dst=1, group=group)  # the lanes are open both ways
        started = time.monotonic()
        group._get_backend(torch.device("cpu")).abort()
        with pytest.raises(dist.DistBackendError):
            work.wait()
        failed_after = time.monotonic() - started
        started = time.monotonic()
        dist.destroy_process_group(group)
        result = (failed_after, time.monotonic() - started, work.is_completed())
    else:
        dist.recv(torch.empty(4), src=0, group=group)
    dist.barrier()  # rank 1 keeps its side of the group open until rank 0 is done
    if me == 1:
        dist.destroy_process_group(group)
    return result


def test_a_break_ends_the_wait_for_a_recv_at_once(rank_pools):
    result, _ = rank_pools(2).run(_a_recv_nobody_sends)
    failed_after, destroyed_after, completed = result
    assert failed_after < 5, result
    assert destroyed_after < 10, result
    assert completed, result
