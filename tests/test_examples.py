"""The main job: the DDP example under torchrun with the streamnccl backend. Every example also
runs with the in-flight write detector on (STREAMNCCL_CHECK_INFLIGHT_WRITES=1), which must find
nothing in them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a torchrun job per test

ROOT = Path(__file__).resolve().parent.parent
INFLIGHT_WRITES_FOUND = "was written while the op was in flight"


def torchrun_command(script, nproc, *args, checks=False, torchrun_args=()):
    """The command and environment that run `script` (a path, or the name of one in examples/)
    under torchrun. `checks`: with the in-flight write detector on."""
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", *torchrun_args,
        str(ROOT / "examples" / script), *args,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if checks:
        env["STREAMNCCL_CHECK_INFLIGHT_WRITES"] = "1"
    return command, env


def torchrun(script, nproc, *args, timeout_s, cwd, checks=False, torchrun_args=()):
    """Runs `script` under torchrun (see torchrun_command); a hang fails the test after
    `timeout_s`."""
    command, env = torchrun_command(
        script, nproc, *args, checks=checks, torchrun_args=torchrun_args
    )
    job = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    try:
        stdout, stderr = job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end(job)
        stdout, _ = job.communicate()
        pytest.fail(f"{script} did not finish within {timeout_s} s:\n{stdout}")
    return subprocess.CompletedProcess(command, job.returncode, stdout, stderr)


class AheadOfTheTests:
    """The one-idea examples' torchrun jobs, each started as the test before it starts waiting:
    a job spends most of its time in its three processes' imports of torch, and two jobs share
    two cores better than one uses them (here, 3.3 s a job alone). Each test waits for its own
    job, with its own timeout, and reads what it printed."""

    def __init__(self, planned, folder):
        self.planned, self.folder, self.jobs = list(planned), folder, {}

    def _start(self, key):
        name, checks = key
        command, env = torchrun_command(f"{name}.py", 2, checks=checks)
        cwd = self.folder / f"{name}-{checks}"
        cwd.mkdir()
        # To files, not pipes: a job nobody reads yet must not stall on a full pipe.
        out, err = open(cwd / "stdout", "w"), open(cwd / "stderr", "w")
        job = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd, text=True)
        out.close()
        err.close()
        self.jobs[key] = (job, cwd)

    def result(self, key, timeout_s):
        if key not in self.jobs:
            self._start(key)
        upcoming = [k for k in self.planned if k not in self.jobs]
        if upcoming:
            self._start(upcoming[0])  # runs beside this one
        job, cwd = self.jobs[key]
        try:
            job.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            end(job)
            pytest.fail(f"examples/{key[0]}.py did not finish within {timeout_s} s")
        stdout, stderr = ((cwd / name).read_text() for name in ("stdout", "stderr"))
        return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)

    def close(self):
        for job, _ in self.jobs.values():
            end(job)


def end(job):
    """Ends a torchrun job and its workers: torchrun ends them on SIGTERM (they are in sessions
    of their own, which a SIGKILL of torchrun would leave running)."""
    if job.poll() is None:
        job.terminate()
        try:
            job.wait(timeout=15)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()


@pytest.mark.parametrize(
    ("nproc", "checks"), [(2, False), (3, False), (2, True)], ids=["2", "3", "2-inflight_checks"]
)
def test_ddp_example_trains_and_ends_with_identical_parameters(nproc, checks, tmp_path):
    done = torchrun(
        "ddp_train.py", nproc, "--steps", "20", timeout_s=240, cwd=tmp_path, checks=checks
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert INFLIGHT_WRITES_FOUND not in output, output
    assert f"backend streamnccl, device cpu, {nproc} ranks" in done.stdout, output
    assert f"parameters identical on all {nproc} ranks" in done.stdout, output
    assert "loss went down" in done.stdout, output
    assert done.stdout.count("loss ") >= 20


ONE_IDEA_EXAMPLES = {
    "broadcast": "broadcast: ok",
    "scatter": "scatter: ok",
    "gather": "gather: ok",
    "reduce": "reduce: ok",
    "all_reduce_max_images": "all_reduce MAX over images: ok",
    "all_gather": "all_gather: ok",
    "reduce_scatter": "reduce_scatter: ok",
    "send_recv": "send/recv and isend/irecv: ok",
    "classifier": "classifier: same weights, loss went down: ok",
    "overlap": "overlap: async all_reduce with compute: ok",
}


@pytest.fixture(scope="module")
def one_idea_jobs(tmp_path_factory):
    jobs = AheadOfTheTests(
        # The tests' order: the stacked parametrize varies its top argument fastest.
        [(name, checks) for name in ONE_IDEA_EXAMPLES for checks in (False, True)],
        tmp_path_factory.mktemp("examples"),
    )
    yield jobs
    jobs.close()


@pytest.mark.parametrize("checks", [False, True], ids=["default", "inflight_checks"])
@pytest.mark.parametrize("name", list(ONE_IDEA_EXAMPLES))
def test_one_idea_example(name, checks, one_idea_jobs):
    done = one_idea_jobs.result((name, checks), timeout_s=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert ONE_IDEA_EXAMPLES[name] in done.stdout, output
    assert INFLIGHT_WRITES_FOUND not in output, output
