"""Helpers the op tests share, run inside rank processes."""

MODES = ["sync", "async"]


def run_op(call, mode):
    """Runs `call(async_op)` sync or async; async waits on the Work and checks completion."""
    if mode == "sync":
        assert call(False) is None
    else:
        work = call(True)
        assert work.wait()
        assert work.is_completed()
