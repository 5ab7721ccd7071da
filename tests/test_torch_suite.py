"""torch's own multi-process test suite, DistributedTest._DistTestBase (shipped in the wheel as
torch/testing/_internal/distributed/distributed_test.py), run against streamnccl on CPU at
world size 2, with the features torch grants gloo.

Every test runs as torch runs it for gloo: fresh rank processes, a FileStore rendezvous, the
default group made by init_process_group("streamnccl"). Each one passes, or is skipped by torch
for a reason that skips it for gloo too (no GPU, world size), or is in KNOWN_FAILURES with the
reason it cannot pass here. A known failure still runs: it must fail, and for that reason.

Tests torch gates on backend names ("only gloo", "only mpi") are reached through the lists
below. STREAMNCCL_SUITE_BACKEND=gloo runs this module against gloo instead, as the reference.
"""

import contextlib
import os
import re
import tempfile
from typing import NamedTuple

# The suite reads its settings from the environment when it is imported.
SUITE_BACKEND = os.environ.get("STREAMNCCL_SUITE_BACKEND", "streamnccl")
os.environ["BACKEND"] = SUITE_BACKEND
os.environ["WORLD_SIZE"] = "2"
os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())  # each test's setUp makes its own
# A hung test fails after this many seconds instead of torch's default of 300.
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")

import pytest  # noqa: E402

pytest.importorskip("expecttest", reason="torch's test suite needs expecttest (scripts/setup.sh)")

import forkserver  # noqa: E402
import streamnccl  # noqa: E402, F401  (registers the backend, here and in every rank)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# What torch grants gloo, streamnccl has too. The suite reads these sets in its decorators,
# so they are granted before it is imported.
for feature in ("gpu", "cuda", "ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[feature].add("streamnccl")

import torch.testing._internal.distributed.distributed_test as suite  # noqa: E402

# torch's own suite reads torch's internals through and through.
pytestmark = [pytest.mark.slow, pytest.mark.torch_internals]

# Tests torch runs only for the backends it names, whose bodies use nothing of those backends'
# own: reached by calling the suite's test function.
REACHED_THROUGH_BACKEND_NAME_GATES = [
    # "get_future is only supported on mpi, nccl and gloo"
    "test_get_future",
    # require_backend_is_available({"gloo"})
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_min",
    "test_all_reduce_coalesced_full_group_max",
    "test_grads_same_across_ranks_with_no_sync",
    "test_scatter_object_list",
    # "Only gloo backend supports timeouts"
    "test_barrier_timeout_full_group",
    # require_backend_is_available({"gloo"}): gloo's monitored barrier, which streamnccl has
    # (on torch before 2.14, the first two are known failures: see below)
    "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_subgroup",
    "test_monitored_barrier_gloo_rank_0_timeout",
    # "GLOO Batch Send Recv CPU"
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    # "Only MPI supports (CPU) all_to_all(_single)": gloo skips these, streamnccl serves them
    "test_all_to_all",
    "test_all_to_all_complex",
    "test_all_to_all_full_group",
    "test_all_to_all_single_equal_split",
    "test_all_to_all_single_equal_split_complex",
    "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all_single_unequal_split_full_group",
]

# Tests whose shared helper sets up its model only `if BACKEND == "mpi" or BACKEND == "gloo"`:
# reached with the suite reading its backend name as "gloo" during the test, while every
# collective still goes to the default group, streamnccl (checked after each).
REACHED_THROUGH_GLOO_BRANCHES = [
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
]


class KnownFailure(NamedTuple):
    why: str  # the reason, as the test report shows it
    pattern: str  # what the ranks' failure says; any other failure fails the run
    until: str | None = None  # the first torch release where it passes (None: none yet)


_MONITORED_BARRIER = (
    "torch before 2.14 refuses dist.monitored_barrier in Python for every backend but gloo "
    "(streamnccl implements it: the group's own monitored_barrier reaches it)"
)

# Tests gloo passes and streamnccl does not (on the torch releases before `until`).
KNOWN_FAILURES = {
    "test_ddp_logging_data_cpu": KnownFailure(
        "no backend registered from Python can pass: DDP logs ProcessGroup::getBackendName(), "
        'which torch sets to "custom" for every registered backend',
        r"'custom' != 'streamnccl'",
    ),
    "test_monitored_barrier_gloo": KnownFailure(
        _MONITORED_BARRIER, r"monitored_barrier is only implemented for GLOO backend", "2.14"
    ),
    "test_monitored_barrier_gloo_subgroup": KnownFailure(
        _MONITORED_BARRIER, r"monitored_barrier is only implemented for GLOO backend", "2.14"
    ),
    "test_sparse_all_reduce_sum": KnownFailure(
        "streamnccl serves dense tensors only, as the built-in nccl backend does; gloo alone "
        "has a sparse all_reduce",
        r"streamnccl allreduce: `tensor` must be a dense \(strided\) tensor, got layout Sparse",
    ),
}
TORCH = torch.torch_version.TorchVersion(torch.__version__)
KNOWN_FAILURES_HERE = {
    name: known
    for name, known in KNOWN_FAILURES.items()
    if known.until is None or TORCH < known.until
}


@contextlib.contextmanager
def _suite_reads_backend_as(name):
    saved = suite.BACKEND
    suite.BACKEND = name
    try:
        yield
    finally:
        suite.BACKEND = saved


def _reach(name, through_gloo_branch=False):
    """The suite's test `name`, without the decorators that skip it for our backend's name."""
    original = getattr(suite.DistributedTest._DistTestBase, name)

    def test(self):
        if not through_gloo_branch:
            original(self)
            return
        ours = dist.group.WORLD._get_backend(torch.device("cpu"))
        ops_before = ours._get_sequence_number_for_group()
        with _suite_reads_backend_as("gloo"):
            original(self)
        assert ours._get_sequence_number_for_group() > ops_before, "streamnccl ran no op"

    test.__name__ = test.__qualname__ = name
    test.__doc__ = original.__doc__
    return test


# Rank processes fork from one server that has imported torch, the suite and this module once,
# instead of each importing them afresh (seconds per process, two per test).
forkserver.preload(__name__)


class TestDistributedSuite(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _spawn_processes(self):
        self._start_processes(forkserver.context().Process)

    def _start_processes(self, proc):
        # As torch's, plus this test's TEMP_DIR and INIT_METHOD (made by setUp), which a rank
        # forked from the server would not inherit.
        environ = {key: os.environ[key] for key in ("TEMP_DIR", "INIT_METHOD")}
        self.processes = []
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = torch.multiprocessing.Pipe()
            process = proc(
                target=self.__class__._run,
                name=f"process {rank}",
                args=(rank, self._current_test_name(), self.file_name, child_conn),
                kwargs={"environ": environ},
            )
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, environ, **kwargs):
        os.environ.update(environ)
        super()._run(rank, test_name, file_name, pipe, **kwargs)

    def _check_return_codes(self, fn, elapsed_time):
        known = KNOWN_FAILURES_HERE.get(self._current_test_name())
        if known is None or SUITE_BACKEND != "streamnccl":
            return super()._check_return_codes(fn, elapsed_time)
        try:
            super()._check_return_codes(fn, elapsed_time)
        except RuntimeError as failure:  # what the ranks raised
            if not re.search(known.pattern, str(failure)):
                raise
            pytest.xfail(known.why)
        raise AssertionError(
            f"{self._current_test_name()} passes now: take it out of KNOWN_FAILURES ({known.why})"
        )


if SUITE_BACKEND == "streamnccl":
    for _name in dict.fromkeys(REACHED_THROUGH_BACKEND_NAME_GATES + list(KNOWN_FAILURES)):
        setattr(TestDistributedSuite, _name, _reach(_name))
    for _name in REACHED_THROUGH_GLOO_BRANCHES:
        setattr(TestDistributedSuite, _name, _reach(_name, through_gloo_branch=True))
