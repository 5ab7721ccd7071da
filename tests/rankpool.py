"""A pool of long-lived torch.distributed rank processes, shared by the tests of a module.

Starting ranks is slow (spawn, import torch, rendezvous), so a pool starts them once and then
sends them module-level functions to run; every rank calls fn(ctx, *args, **kwargs).
"""

import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import forkserver
import torch
import torch.distributed as dist

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# Once a rank has failed, its peers are usually stuck in a collective waiting for it.
ERROR_GRACE_S = 5.0
forkserver.preload(__name__)


class RankContext:
    """First argument of every function run by the pool."""

    def __init__(self, rank, world_size, gloo):
        self.rank, self.world_size = rank, world_size
        self.gloo = gloo  # reference group to compute expected values with

    def seed(self, i):
        """Generator that differs per rank and per i, but is the same in every run."""
        return torch.Generator().manual_seed(1_000_003 * i + self.rank)


def _exit_when_parent_dies(parent_pid):
    # Daemon children are only reaped when the parent exits cleanly; this covers a killed
    # pytest, even while the main thread hangs in a collective. (The test process is not this
    # one's parent: the fork server is.)
    while True:
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        time.sleep(0.5)


def _send(conn, kind, value):
    # Plain pickle copies tensors by value; the Connection default would move them to
    # shared memory through torch's reducers, which we do not need.
    conn.send_bytes(pickle.dumps((kind, value)))


def _worker(rank, world_size, backend, store_port, timeout_s, conn, parent_pid, environ):
    # Forked from the server (forkserver.py), whose environment is not the test's.
    os.environ.clear()
    os.environ.update(environ)
    threading.Thread(target=_exit_when_parent_dies, args=(parent_pid,), daemon=True).start()
    # On a hang the parent asks for every thread's stack before it kills us.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Ctrl-C reaches the whole process group; the parent owns it and stops or kills us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        torch.set_num_threads(1)  # world_size processes share a few cores
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(store_port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
        )
        if "streamnccl" in backend:
            import streamnccl  # noqa: F401  (registers the backend with torch.distributed)
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timeout)
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, store=store, timeout=timeout
        )
        ctx = RankContext(rank, world_size, dist.new_group(backend="gloo"))
    except BaseException:
        _send(conn, "error", traceback.format_exc())
        return
    _send(conn, "ok", None)
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:  # the parent is gone
            return
        except Exception:  # e.g. the function's module cannot be imported here
            _send(conn, "error", traceback.format_exc())
            continue
        if message is None:
            break
        fn, args, kwargs = message
        try:
            reply = pickle.dumps(("ok", fn(ctx, *args, **kwargs)))
        except BaseException:  # keep serving: the next test must not pay for a restart
            reply = pickle.dumps(("error", traceback.format_exc()))
        conn.send_bytes(reply)
    if dist.is_initialized():  # a test may have destroyed it already
        dist.destroy_process_group()
    # Interpreter teardown with torch loaded takes seconds on a busy machine, and nothing
    # is left to finalize once the process group is destroyed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class RankPool:
    def __init__(self, world_size, backend, timeout_s=60, start_timeout_s=60):
        __tracebackhide__ = True
        self.world_size, self.backend = world_size, backend
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._procs = None  # None means dead: the next run() starts a fresh pool
        self._start()

    def _start(self):
        __tracebackhide__ = True
        # Children copy our sys.path: they must import this file and the test modules.
        if TESTS_DIR not in sys.path:
            sys.path.insert(0, TESTS_DIR)
        # We host the rendezvous store on a port the OS picks, so there is no free-port race
        # and it does not depend on any rank staying alive.
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        ranks = forkserver.context()
        self._procs, self._conns = [], []
        for rank in range(self.world_size):
            parent_end, child_end = ranks.Pipe()
            proc = ranks.Process(
                target=_worker,
                name=f"rank{rank}",
                daemon=True,
                args=(
                    rank,
                    self.world_size,
                    self.backend,
                    self._store.port,
                    self.timeout_s,
                    child_end,
                    os.getpid(),
                    dict(os.environ),
                ),
            )
            proc.start()
            child_end.close()  # so a dead child shows up as EOF on our end
            self._procs.append(proc)
            self._conns.append(parent_end)
        try:
            self._collect(self.start_timeout_s, f"startup of {self.backend} ranks")
        except AssertionError:
            self._kill()  # ranks that failed to start have returned: the pool is unusable
            raise

    def run(self, fn, *args, timeout=None, expect_deaths=(), **kwargs):
        """Run fn(ctx, *args, **kwargs) on every rank; return the results in rank order.
        Ranks in `expect_deaths` must exit during the run (their result is None); the pool
        is restarted for the next run."""
        __tracebackhide__ = True  # pytest: show the rank failures, not this machinery
        if self._procs is None:
            self._start()
        message = pickle.dumps((fn, args, kwargs))
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a dead rank is reported by _collect
                conn.send_bytes(message)
        what = getattr(fn, "__qualname__", repr(fn))
        return self._collect(timeout or self.timeout_s, what, set(expect_deaths))

    def _collect(self, timeout_s, what, expect_deaths=frozenset()):
        __tracebackhide__ = True
        start = time.monotonic()
        deadline = start + timeout_s
        replies, pending = {}, set(range(self.world_size))
        owner = {h: r for r in pending for h in (self._conns[r], self._procs[r].sentinel)}
        while pending and time.monotonic() < deadline:
            handles = [h for h, r in owner.items() if r in pending]
            for handle in wait(handles, deadline - time.monotonic()):
                rank = owner[handle]
                if rank in pending:
                    replies[rank] = self._read_reply(rank)
                    pending.discard(rank)
            if any(kind != "ok" and r not in expect_deaths for r, (kind, _) in replies.items()):
                deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
        failures = [
            f"rank {r} failed in {what}:\n{text}"
            for r, (kind, text) in sorted(replies.items())
            if kind != ("died" if r in expect_deaths else "ok")
        ]
        if pending:
            failures.append(
                f"ranks {sorted(pending)} did not answer within "
                f"{time.monotonic() - start:.0f} s: probable hang in {what}"
            )
        if pending:
            self._dump_stacks(pending)
        if pending or any(kind == "died" for kind, _ in replies.values()):
            self._kill()
        if failures:
            raise AssertionError("\n".join(failures))
        return [None if r in expect_deaths else replies[r][1] for r in range(self.world_size)]

    def _read_reply(self, rank):
        conn, proc = self._conns[rank], self._procs[rank]
        try:
            return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            proc.join(timeout=5)
            return "died", f"process exited with code {proc.exitcode}"

    def _dump_stacks(self, ranks):
        """Has hung ranks print every thread's Python stack (to the test's captured stderr)."""
        for rank in sorted(ranks):
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
        time.sleep(1.0)

    def _kill(self):
        if self._procs is None:
            return
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs = self._conns = self._store = None

    def close(self):
        """Stop the ranks cleanly; return their exit codes (None if they had to be killed)."""
        if self._procs is None:
            return []
        for conn in self._conns:
            with contextlib.suppress(OSError):  # already dead
                conn.send_bytes(pickle.dumps(None))
        deadline = time.monotonic() + 5
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        exit_codes = [proc.exitcode for proc in self._procs]
        self._kill()
        return exit_codes
