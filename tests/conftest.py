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
