"""A third-party trainer's shape on streamnccl and on gloo: `barrier(device_ids=[local_rank])`
on a machine without a GPU runs on the host, as gloo's does, and the DDP steps between the
barriers end with gloo's parameters."""

import json
from pathlib import Path

import pytest
import torch
from test_examples import torchrun

pytestmark = [pytest.mark.slow, pytest.mark.torch_internals]  # torch's barrier(device_ids)

JOB = Path(__file__).resolve().parent / "jobs" / "trainer_shape.py"
MOVED_TO_HOST = "barriers naming one run on the host instead, as gloo's do"


def parameters_after(backend, tmp_path):
    done = torchrun(JOB, 2, "--backend", backend, timeout_s=180, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("parameters: ")]
    return torch.tensor(json.loads(line.removeprefix("parameters: "))), output


@pytest.mark.skipif(torch.cuda.is_available(), reason="the device ids name real GPUs here")
def test_a_trainers_barrier_naming_a_device_runs_on_the_host_and_training_matches_gloo(tmp_path):
    ours, output = parameters_after("streamnccl", tmp_path)
    theirs, _ = parameters_after("gloo", tmp_path)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    # Said once per group and rank, though each rank waits twice.
    assert output.count(MOVED_TO_HOST) == 2, output
