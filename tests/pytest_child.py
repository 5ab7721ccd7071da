"""pytest in a process forked from the test run's fork server (forkserver.py), which has torch
and streamnccl imported already: test_fake_models.py runs single tests so, each in a fresh
process, in a fraction of the time a new interpreter takes. Imports nothing of the tests, so
that they read the environment the child is given."""

import os
import sys


def run(args, environ, output, cwd):
    """Runs `pytest args` in `cwd` with `environ`, its output to the file `output`; the
    process's exit code is pytest's."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    written = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(written, 1)
    os.dup2(written, 2)
    import pytest

    code = pytest.main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))
