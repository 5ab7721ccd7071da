"""The main job: the DDP example under torchrun with the streamnccl backend."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("nproc", [2, 3])
def test_ddp_example_trains_and_ends_with_identical_parameters(nproc, tmp_path):
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
        str(ROOT / "examples" / "ddp_train.py"), "--steps", "20",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path
        )
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"the DDP example did not finish within 240 s:\n{timeout.stdout}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
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


@pytest.mark.parametrize("name", list(ONE_IDEA_EXAMPLES))
def test_one_idea_example(name, tmp_path):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
        str(ROOT / "examples" / f"{name}.py"),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
        )
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"examples/{name}.py did not finish within 120 s:\n{timeout.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ONE_IDEA_EXAMPLES[name] in done.stdout, done.stdout + done.stderr
