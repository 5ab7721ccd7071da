"""The fake GPU is the only proof the NCCL path gets without a GPU, so each semantic it models
is tested as a product: a test here (or elsewhere, named in LOAD_BEARING) shows the model at
work, and test_each_model_is_load_bearing runs those tests again with the model switched off
(STREAMNCCL_FAKE_MODELS_OFF) and requires every one of them to fail."""

import gc
import os
import re
import tempfile
import threading
import time
from datetime import timedelta

import fakes
import forkserver
import pytest
import pytest_child
import torch
from fakes import fake_group, fake_ranks, needs_nccl_path, opts, settle
from streamnccl import _testing
from torch._C._distributed_c10d import AllreduceCoalescedOptions, AllreduceOptions

pytestmark = needs_nccl_path
# Its children run pytest on the fake: the fork server imports them once (see run_pytest).
forkserver.preload("pytest", "streamnccl._testing")
CPU = torch.device("cpu")

# For each model, tests that fail without it.
LOAD_BEARING = {
    "memory": [
        "test_fake_models.py::test_memory_a_read_of_freed_memory_is_reported",
        "test_nccl_lifecycle.py::test_wait_lets_go_only_once_the_op_has_run",
    ],
    "devices": ["test_nccl_path_semantics.py::test_no_thread_makes_a_context_on_another_device"],
    "capture": [
        "test_fake_models.py::test_capture_a_prohibited_query_invalidates_it",
        "test_nccl_lifecycle.py::test_a_captured_op_holds_its_factor_until_wait",
    ],
    "aten_kernels": ["test_fake_models.py::test_aten_kernels_run_in_stream_order"],
    "peers": [
        "test_fake_models.py::test_peers_a_send_completes_only_with_its_recv",
        "test_nccl_lifecycle.py::test_an_isend_irecv_swap_runs_with_a_queue_per_stream",
    ],
    "teardown": ["test_fake_models.py::test_teardown_finalize_waits_for_every_member"],
    "progress": ["test_fake_models.py::test_progress_the_gpu_runs_without_being_asked"],
    "in_progress": ["test_fake_models.py::test_in_progress_a_group_end_can_be_still_enqueueing"],
    "cuda_errors": [
        "test_nccl_lifecycle.py::test_a_cuda_error_in_the_watchdog_breaks_the_group_with_evidence"
    ],
    "shrink": [
        "test_nccl_shrink.py::test_survivors_shrink_the_communicator_and_gather_among_themselves"
    ],
    "split": [
        "test_nccl_split.py::test_split_group_splits_the_parents_communicator_into_each_part"
    ],
    "registration": [
        "test_nccl_memory.py::test_registration_memory_freed_while_registered_is_reported",
        "test_nccl_memory.py::test_registration_deregistering_under_a_queued_kernel_is_reported",
        "test_nccl_memory.py::"
        "test_registration_a_handle_deregistered_twice_or_on_another_communicator_is_reported",
    ],
    "single_queue": [
        "test_nccl_lifecycle.py::test_with_one_hardware_queue_a_swap_times_out_naming_the_lanes"
    ],
}


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _testing.FakeGpu.forget_thread_device()


def test_memory_a_read_of_freed_memory_is_reported():
    # A user's kernel on another stream reads a tensor that is freed, and its block handed
    # out again, before the kernel runs: nothing held it.
    pg, gpu = fake_group()
    gpu.hold_events(True)
    x = torch.ones(8)
    gpu.use_stream(5)
    read = gpu.read(x)
    gpu.use_stream(0)
    del x
    reused = torch.empty(8)  # the same block, on the stream it was freed on
    gpu.write(reused, 2.0)
    gpu.hold_events(False)
    violations = settle(gpu)
    assert any(
        "read on S5 ran after its read buffer (allocated on S0) was freed" in v for v in violations
    ), violations
    assert not torch.equal(read.value(), torch.ones(8))  # it read the next tensor's data


def test_capture_a_prohibited_query_invalidates_it():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(CPU)
    gpu.hold_events(True)
    work = pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
    gpu.begin_capture("global")
    # A query on the capturing thread: CUDA refuses it, and invalidates the capture.
    assert not work.is_completed()
    assert gpu.end_capture().startswith("invalidated: cudaEventQuery on the capturing thread")
    gpu.hold_events(False)
    # The device is fine: the op is still in flight, and completes, and the group goes on.
    work.wait()
    pg.allreduce([torch.ones(4)], opts(AllreduceOptions, False)).wait()
    assert settle(gpu) == []


def test_aten_kernels_run_in_stream_order():
    # A non-contiguous tensor is copied, reduced and copied back, all on the op's stream.
    pg, gpu = fake_group()
    pg.eager_connect_single_device(CPU)
    x = torch.ones(6, 2).t()
    pg.allreduce([x], opts(AllreduceOptions)).wait()
    assert gpu.synchronize()
    assert gpu.ran() == ["S1 copy_", "S1 ncclAllReduce", "S1 copy_"]
    assert torch.equal(x, torch.full((2, 6), 3.0))


def _first_message(rank, pg, gpu):
    # Opens (and connects) the lane 0->1 on both ranks.
    if rank == 0:
        pg.send([torch.ones(1)], 1, 0).wait(timedelta(seconds=10))
    else:
        pg.recv([torch.zeros(1)], 0, 0).wait(timedelta(seconds=10))


def test_peers_a_send_completes_only_with_its_recv():
    groups = fake_ranks(2)
    fakes.run_ranks(groups, _first_message)
    (pg0, gpu0), (pg1, gpu1) = groups
    sent = pg0.send([torch.full((4,), 7.0)], 1, 0)
    time.sleep(0.2)  # time enough for a send that needed nobody
    assert not sent.is_completed()  # rank 1 has not posted its recv
    inbox = torch.zeros(4)
    pg1.recv([inbox], 0, 0).wait(timedelta(seconds=10))
    sent.wait(timedelta(seconds=10))
    assert gpu1.synchronize() and torch.equal(inbox, torch.full((4,), 7.0))
    fakes.shut_down(groups)


def test_teardown_finalize_waits_for_every_member():
    # A node's ranks finalize a communicator together: rank 0's teardown ends only once
    # rank 1 has begun its own.
    groups = fakes.connect(fake_ranks(2))
    (pg0, gpu0), (pg1, gpu1) = groups
    closing = threading.Thread(target=pg0.shutdown)
    closing.start()
    closing.join(0.5)
    assert closing.is_alive(), "rank 0 finalized alone"
    pg1.shutdown()
    closing.join(10)
    assert not closing.is_alive()
    for gpu in (gpu0, gpu1):
        calls = gpu.calls()
        assert calls.index("ncclCommFinalize(C0)") < calls.index("ncclCommDestroy(C0)")


def test_progress_the_gpu_runs_without_being_asked():
    # A user's kernel, which no event of the group's follows: nobody will ever query it.
    pg, gpu = fake_group()
    x = torch.zeros(4)
    gpu.write(x, 5.0)
    deadline = time.monotonic() + 5
    while not torch.equal(x, torch.full((4,), 5.0)) and time.monotonic() < deadline:
        time.sleep(0.01)  # looking at the memory asks the GPU nothing
    assert torch.equal(x, torch.full((4,), 5.0))


def test_in_progress_a_group_end_can_be_still_enqueueing():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(CPU)
    gpu.in_progress_next("ncclGroupEnd", 3)
    x, y = torch.ones(2), torch.ones(3)
    pg.allreduce_coalesced([x, y], opts(AllreduceCoalescedOptions)).wait()
    assert "ncclGroupEnd() -> ncclInProgress on C0" in gpu.calls()
    assert settle(gpu) == []  # nothing was recorded on the stream while it was enqueueing
    assert torch.equal(x, torch.full((2,), 3.0)) and torch.equal(y, torch.full((3,), 3.0))


def run_pytest(tests, **env):
    """pytest on `tests` in a fresh process (forked, with torch imported) whose environment
    has `env` too; returns its exit code and its last line."""
    with tempfile.TemporaryDirectory() as folder:
        output = os.path.join(folder, "pytest.out")
        args = ["-q", "-p", "no:cacheprovider", *tests]
        child = forkserver.context().Process(
            target=pytest_child.run, args=(args, dict(os.environ, **env), output, fakes.TESTS_DIR)
        )
        child.start()
        child.join(300)
        lines = [line for line in open(output).read().splitlines() if line.strip()]
        if child.is_alive():
            child.kill()
            child.join()
            pytest.fail(f"pytest {' '.join(tests)} did not end within 300 s:\n" + "\n".join(lines))
    return child.exitcode, lines[-1] if lines else "(no output)"


@pytest.mark.slow
def test_the_load_bearing_tests_pass_with_every_model_on_and_short_waits():
    # The control of the check below, which shortens the fakes' waits: these tests fail there
    # for want of their model, not of time.
    tests = sorted({test for tests in LOAD_BEARING.values() for test in tests})
    returncode, summary = run_pytest(tests, **{fakes.SHORT_WAITS_VARIABLE: "1"})
    assert returncode == 0 and re.match(r"\d+ passed", summary), summary
    assert not re.search(r"failed|error", summary), summary


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(LOAD_BEARING))
def test_each_model_is_load_bearing(model):
    # Each test in a process of its own: with a model off, the fake may be left in an
    # undefined state (freed memory no longer tracked), which must not decide another test.
    for test in LOAD_BEARING[model]:
        returncode, summary = run_pytest([test], **{fakes.MODELS_OFF_VARIABLE: model})
        assert returncode != 0 and re.search(r"\d+ passed", summary) is None, (
            f"with the {model} model off, {test}, which needs it, still passed: {summary}"
        )
