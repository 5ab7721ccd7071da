"""The host path's worker threads: named, so that py-spy, gdb and top show whose they are, and
left asleep by sync ops, which run on the caller's thread when the worker is idle."""

import glob
import sys
import time
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads thread states from /proc"
)


def threads_named(name):
    """{tid: voluntary context switches} of this process's threads called `name`."""
    switches = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(f"{task}/comm") as comm:
                if comm.read().strip() != name:
                    continue
            with open(f"{task}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        switches[task] = int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return switches


def test_a_group_of_sync_ops_starts_no_worker_thread():
    # Sync host ops run on their callers: a group that only has those needs no thread of its
    # own, and with one per group, 64 subgroups would hold 64 idle threads.
    others = set(threads_named("streamnccl-host"))  # other tests' groups, in this process
    store = dist.HashStore()
    timeout = timedelta(seconds=60)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), 0, 1, timeout)
    group = streamnccl.ProcessGroup(store, 0, 1, timeout, streamnccl.Options(), gloo)
    sync = AllreduceOptions()
    sync.asyncOp = False
    x = torch.ones(4)
    for _ in range(3):
        group.allreduce([x], sync)
    assert torch.equal(x, torch.ones(4))
    assert set(threads_named("streamnccl-host")) <= others
    asynchronous = AllreduceOptions()
    asynchronous.asyncOp = True
    group.allreduce([x], asynchronous).wait()  # the first async op starts it
    deadline = time.monotonic() + 10
    while not set(threads_named("streamnccl-host")) - others:
        assert time.monotonic() < deadline, "an async op started no worker thread"
        time.sleep(0.01)
    group.shutdown()
    del group


def test_a_sync_op_does_not_wake_the_idle_worker():
    store = dist.HashStore()
    timeout = timedelta(seconds=60)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), 0, 1, timeout)
    group = streamnccl.ProcessGroup(store, 0, 1, timeout, streamnccl.Options(), gloo)
    sync = AllreduceOptions()
    sync.asyncOp = False
    x = torch.ones(4)
    asynchronous = AllreduceOptions()
    asynchronous.asyncOp = True
    group.allreduce([x], asynchronous).wait()  # opens the host path and starts its worker
    # The worker names itself once it runs, which on a busy machine may be a moment later.
    deadline = time.monotonic() + 10
    while not (before := threads_named("streamnccl-host")):
        assert time.monotonic() < deadline, (
            "no thread named streamnccl-host: the worker is not named"
        )
        time.sleep(0.01)
    ops = 300
    for _ in range(ops):
        group.allreduce([x], sync)
    after = threads_named("streamnccl-host")
    woken = sum(after[t] - before[t] for t in before if t in after)
    # The worker sleeps throughout: each op ran on this thread. One wake per op (the defect
    # this guards against) doubles the context switches of every small sync op.
    assert woken < ops // 10, f"the idle worker woke {woken} times in {ops} sync ops"
    assert torch.equal(x, torch.ones(4))
    group.shutdown()
    del group
