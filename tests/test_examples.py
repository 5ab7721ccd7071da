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


def torchrun(script, nproc, *args, timeout_s, cwd, checks=False, torchrun_args=()):
    """Runs `script` (a path, or the name of one in examples/) under torchrun; a hang fails the
    test after `timeout_s`. `checks`: with the in-flight write detector on."""
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", *torchrun_args,
        str(ROOT / "examples" / script), *args,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if checks:
        env["STREAMNCCL_CHECK_INFLIGHT_WRITES"] = "1"
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd
        )
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"{script} did not finish within {timeout_s} s:\n{timeout.stdout}")


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


@pytest.mark.parametrize("checks", [False, True], ids=["default", "inflight_checks"])
@pytest.mark.parametrize("name", list(ONE_IDEA_EXAMPLES))
def test_one_idea_example(name, checks, tmp_path):
    done = torchrun(f"{name}.py", 2, timeout_s=120, cwd=tmp_path, checks=checks)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert ONE_IDEA_EXAMPLES[name] in done.stdout, output
    assert INFLIGHT_WRITES_FOUND not in output, output
