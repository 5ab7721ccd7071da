"""The one server this test process forks its rank processes from: preloaded with torch,
streamnccl and the test modules that ask, so a rank starts in a fraction of a second instead of
importing them afresh (seconds each, and the suite starts hundreds).

A forked rank has the server's environment, not the test's: what it needs of the test's
(variables a test set) it must be handed (rankpool.py does)."""

import multiprocessing.forkserver
import os

import torch.multiprocessing

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_CONTEXT = torch.multiprocessing.get_context("forkserver")
_PRELOAD = ["torch", "torch.distributed", "streamnccl"]


def preload(*modules):
    """Has the server import `modules` too. Called as test modules are imported (collected), so
    the server, started at the first rank, preloads every module of the run that asks."""
    _PRELOAD.extend(name for name in modules if name not in _PRELOAD)


def context():
    """The forkserver context, its server running (started now if need be)."""
    _CONTEXT.set_forkserver_preload(_PRELOAD)
    # Python 3.11's forkserver ignores sys.path when it preloads: it finds the test modules
    # through PYTHONPATH, set only while it starts.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS_DIR, saved]))
    try:
        multiprocessing.forkserver.ensure_running()  # returns at once once it runs
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    return _CONTEXT
