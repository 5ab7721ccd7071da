"""A flight recorder dump made to block, to look at a failing group while it writes its dump.

A full FIFO waits at the name the dump is first written under (GroupHealth writes it whole
under `.writing_rank_<rank>`, then renames it), so that the dump's writer blocks in its first
write until the test reads the FIFO. Linux only: the FIFO's size is set with fcntl, and the
writer is seen through /proc/self/fd.
"""

import contextlib
import fcntl
import os
import pickle
import time


class BlockedDump:
    """Use it as a context manager: whatever happens in the test, its end lets the writer go
    (the dump then fails to write), so that a failed assertion is not a hang."""

    def __init__(self, dump_dir, rank):
        self.path = os.path.join(os.path.realpath(dump_dir), f".writing_rank_{rank}")
        self.written = os.path.join(os.path.realpath(dump_dir), f"streamnccl_trace_rank_{rank}")
        os.mkfifo(self.path)
        # Open for reading and writing, which never blocks (a plain open waits for a writer),
        # and filled: the writer's first write then waits for read().
        self._held = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        fcntl.fcntl(self._held, fcntl.F_SETPIPE_SZ, 4096)
        self._filled = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                self._filled += os.write(self._held, b"\0" * 4096)

    def wait_for_writer(self, timeout_s):
        """Returns once the dump's writer (a thread of this process) has the FIFO open."""
        deadline = time.monotonic() + timeout_s
        while self._descriptors() < 2:  # ours, and the writer's
            assert time.monotonic() < deadline, f"no dump began within {timeout_s} s"
            time.sleep(0.01)

    def read(self):
        """Lets the writer finish, and returns the dump."""
        with open(self.path, "rb") as pipe:  # the writer has it open: no wait
            os.close(self._held)
            self._held = None
            return pickle.loads(pipe.read()[self._filled :])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._held is not None:
            # Unlinked first, so that no later writer opens the FIFO (and waits for a reader);
            # a writer in it meets the closed end and gives up.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self._held)
            self._held = None

    def _descriptors(self):
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # closed meanwhile
                count += os.readlink(f"/proc/self/fd/{fd}") == self.path
        return count
