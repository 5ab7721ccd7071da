"""Shared helpers of the tests that run the NCCL path on the fake GPU (csrc/fake/).

A fake group's CPU tensors take the real NCCL path over fakes of NCCL and CUDA. Its GPU runs
its streams on a thread of its own: what a test reads directly must be read after
``gpu.synchronize()``, as after ``torch.cuda.synchronize()``, or on a stream with ``gpu.read``.

``STREAMNCCL_FAKE_MODELS_OFF=name,...`` switches models of the fake off in every fake made here,
so that a test of a model can be shown to fail without it (test_fake_models.py does).
"""

import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from streamnccl import _testing

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
CHILD_TIMEOUT_S = 60
MODELS_OFF_VARIABLE = "STREAMNCCL_FAKE_MODELS_OFF"
MODELS_OFF = [name for name in os.environ.get(MODELS_OFF_VARIABLE, "").split(",") if name]
SHORT_WAITS_VARIABLE = "STREAMNCCL_FAKE_SHORT_WAITS"
# With a model off (test_fake_models.py), a test runs to be seen failing, often by ranks that
# wait for each other for good: its waits are cut short, which only makes it fail sooner. A
# test that still passes within them shows the model is not load-bearing; every such test
# passes with them cut short and every model on (test_fake_models.py checks that too).
WAIT_SCALE = 0.25 if MODELS_OFF or os.environ.get(SHORT_WAITS_VARIABLE) == "1" else 1.0
CPU = torch.device("cpu")  # a fake group's "cuda" tensors

needs_nccl_path = pytest.mark.skipif(
    not hasattr(_testing, "recording_process_group"),
    reason="this build has no NCCL path (STREAMNCCL_BUILD_NCCL=0 or a CPU-only torch)",
)


def models(**switches):
    """The fake's models: `switches`, then those the environment switches off, which win."""
    chosen = dict(switches)
    chosen.update({name: False for name in MODELS_OFF})
    return chosen


def fake_world(simulate_peers=False, **switches):
    """Where several fake groups (ranks, one thread each) meet."""
    return _testing.FakeNcclWorld(simulate_peers=simulate_peers, models=models(**switches))


def fake_group(rank=0, size=3, timeout=None, store=None, world=None, **settings):
    """A group over the fakes and its GPU. Without `world`, its peers are mirrors of it: a
    collective computes as if every rank held this rank's data."""
    switches = settings.pop("models", {})
    timeout = timeout or timedelta(seconds=10 * WAIT_SCALE)
    if world is None:
        settings["models"] = models(**switches)
    return _testing.recording_process_group(
        store or dist.HashStore(), rank, size, timeout, world=world, **settings
    )


def fake_ranks(size, timeout=None, world=None, store=None, **settings):
    """`size` fake groups meeting in one world, and in one `store`, as [(pg, gpu)] in rank
    order."""
    world = world or fake_world()
    store = store or dist.HashStore()
    timeout = timeout or timedelta(seconds=20 * WAIT_SCALE)
    return [
        fake_group(rank=r, size=size, store=store, world=world, timeout=timeout, **settings)
        for r in range(size)
    ]


def connect(groups):
    """Opens every rank's communicator at once (NCCL's init waits for every member)."""
    run_ranks(groups, lambda rank, pg, gpu: pg.eager_connect_single_device(CPU))
    return groups


def shut_down(groups):
    """Shuts every rank's group down at once, as separate processes would: a node's ranks
    finalize a communicator together, so one thread closing them in turn would wait."""
    run_ranks(groups, lambda rank, pg, gpu: pg.shutdown())


def run_ranks(groups, program, timeout_s=30 * WAIT_SCALE):
    """Runs program(rank, pg, gpu) for every rank, each on a thread of its own; returns their
    results in rank order. A rank that raises or does not end in time fails the test."""
    results, errors = {}, []

    def rank(r):
        try:
            pg, gpu = groups[r]
            results[r] = program(r, pg, gpu)
        except BaseException as error:  # noqa: B036 (reported below, whatever it is)
            errors.append(f"rank {r}: {error!r}")

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(len(groups))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [r for r, thread in enumerate(threads) if thread.is_alive()]
    assert not stuck, f"ranks {stuck} did not finish within {timeout_s} s (a deadlock); {errors}"
    assert not errors, errors
    return [results[r] for r in range(len(groups))]


def opts(kind, async_op=True, **fields):
    options = kind()
    options.asyncOp = async_op
    for name, value in fields.items():
        setattr(options, name, value)
    return options


def settle(gpu, seconds=0.3):
    """Lets the watchdog (every 50 ms) look at what is in flight and the GPU run what it can,
    then returns the violations."""
    time.sleep(seconds)
    gpu.synchronize(timedelta(seconds=5))
    return gpu.violations()


def run_child(module, scenario, timeout_s=CHILD_TIMEOUT_S):
    """Runs `scenario` (code using `module`'s helpers as `t`) in a fresh interpreter; returns
    its output. A hang or a crash fails the test with what the child printed."""
    code = f"import {module} as t\n" + textwrap.dedent(scenario)
    env = dict(os.environ, PYTHONPATH=TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        child = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
            env=env, cwd=TESTS_DIR,
        )  # fmt: skip
    except subprocess.TimeoutExpired as hang:
        pytest.fail(f"the scenario hung for {timeout_s} s (a deadlock):\n{hang.stdout}")
    assert child.returncode == 0, f"the child died ({child.returncode}):\n{child.stderr[-3000:]}"
    return child.stdout
