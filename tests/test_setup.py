"""The README's commands install into a virtual environment of the project's own unless PYTHON
names another interpreter, so a user's Python and its packages (a torch of their own) stay as
they were."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def resolved_python(checkout, **env):
    """The PYTHON scripts/python-env.sh settles on in `checkout`, with `env` as the variables."""
    script = checkout / "scripts" / "python-env.sh"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHON"} | env
    result = subprocess.run(
        ["bash", "-c", f'source "{script}" && echo "$PYTHON"'],
        capture_output=True, text=True, env=environ, cwd=checkout, timeout=120, check=True,
    )  # fmt: skip
    return result.stdout.strip()


@pytest.mark.slow
def test_default_is_a_fresh_project_virtual_environment(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "python-env.sh", tmp_path / "scripts")
    python = resolved_python(tmp_path)
    assert python == str(tmp_path / ".venv" / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import sys, importlib.util as u; "
         "print(sys.prefix != sys.base_prefix, u.find_spec('torch') is None)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # A virtual environment, holding nothing of the Python it was made from.
    assert probe.stdout.split() == ["True", "True"]
    # Made once: the next script reuses it.
    assert resolved_python(tmp_path) == python


def test_an_interpreter_named_by_PYTHON_is_used_as_it_is(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "python-env.sh", tmp_path / "scripts")
    assert resolved_python(tmp_path, PYTHON=sys.executable) == sys.executable
    assert not (tmp_path / ".venv").exists()
