"""torchelastic restarts: the workers torchrun starts again after a crash meet afresh and resume
from a checkpoint (examples/elastic_restart.py). Before each attempt kept to store keys of its
own, the restarted workers read the dead ones' Gloo addresses and hung or failed."""

import pytest
from test_examples import torchrun

pytestmark = [pytest.mark.slow, pytest.mark.torch_internals]  # torchelastic's restarts


@pytest.mark.parametrize("run", range(3))
def test_restarted_workers_resume_from_the_checkpoint(run, tmp_path):
    checkpoint = str(tmp_path / "checkpoint.pt")
    done = torchrun(
        "elastic_restart.py", 2, checkpoint, torchrun_args=["--max-restarts=1"],
        timeout_s=180, cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for rank in range(2):
        assert f"rank {rank}, attempt 1: resumed at step 5" in output, output
    assert "attempt 1 finished: parameters identical" in done.stdout, output
