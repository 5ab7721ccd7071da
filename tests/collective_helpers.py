"""Helpers the op tests share, run inside rank processes."""

import sys

MODES = ["sync", "async"]


def run_op(call, mode):
    """Runs `call(async_op)` sync or async; async waits on the Work and checks completion."""
    if mode == "sync":
        assert call(False) is None
    else:
        work = call(True)
        assert work.wait()
        assert work.is_completed()


def call_keeping_the_gil_until_it_blocks(call, about_to_call):
    """Sets `about_to_call` and returns `call()`. Until `call` blocks, this thread keeps the GIL
    (a switch interval of 1000 s): a thread waiting for `about_to_call` runs only once `call`
    lets the GIL go, and never if it keeps the GIL while it blocks."""
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        about_to_call.set()
        return call()
    finally:
        sys.setswitchinterval(switch_interval)
