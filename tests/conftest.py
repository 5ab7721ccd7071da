import os
import sys

import pytest
from rankpool import RankPool

BACKEND = "streamnccl"  # the backend under test
TIMEOUT_S = 60  # per run() and per collective; a hung test fails after this


@pytest.fixture(scope="module")
def rank_pools():
    """pool_for(world_size): one RankPool per world size, shared by the tests of a module."""
    pools = {}

    def pool_for(world_size):
        if world_size not in pools:
            pools[world_size] = RankPool(world_size, BACKEND, TIMEOUT_S)
        return pools[world_size]

    yield pool_for
    for pool in pools.values():
        pool.close()


_exit_status = 0


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_unconfigure(config):
    # A run with a fake model switched off (test_fake_models.py runs its tests so, to see them
    # fail) leaves groups in states no teardown was made for: once pytest has reported, the
    # process ends without shutting them down at exit, which could wait out their timeouts.
    if os.environ.get("STREAMNCCL_FAKE_MODELS_OFF"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
