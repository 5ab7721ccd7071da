"""NCCL's memory on a real GPU, world size 1: the group's allocator (ncclMemAlloc) behind a
torch.cuda.MemPool and allocate_tensor, the pool's segments registered with the group's
communicator (ncclCommRegister), a collective on them, then deregistered and freed, as with
ProcessGroupNCCL. The fake GPU's tests of the same: tests/test_nccl_memory.py. Skipped with a
reason without a GPU."""

import gc
from datetime import timedelta

import pytest
import streamnccl  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the NCCL path is compiled, not run"
)
CUDA = torch.device("cuda", 0)
GARBAGE = -7.0


@pytest.fixture
def backend(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(
        "streamnccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    dist.all_reduce(torch.ones(1, device=CUDA))  # opens the group's communicator on cuda:0
    yield dist.distributed_c10d._get_default_group()._get_backend(CUDA)
    dist.destroy_process_group()


def test_a_mem_pool_of_the_groups_allocator_registers_and_carries_a_collective(backend):
    assert backend.supports_tensor_alloc(CUDA)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool):
        x = torch.arange(4096, dtype=torch.float32, device=CUDA) + 1
        out = torch.full((4096,), GARBAGE, device=CUDA)
    backend.register_mem_pool(pool)
    for async_op in (False, True):
        out.fill_(GARBAGE)
        work = dist.all_gather_into_tensor(out, x, async_op=async_op)
        if async_op:
            work.wait()
        assert torch.equal(out, x)
    backend.deregister_mem_pool(pool)
    del x, out
    gc.collect()
    del pool
    torch.cuda.synchronize()


def test_allocate_tensor_hands_out_nccl_memory_a_collective_fills(backend):
    x = backend.allocate_tensor(1024, dtype=torch.float32, device=CUDA)
    assert x.device == CUDA and x.shape == (1024,)
    x.copy_(torch.arange(1024.0, device=CUDA))
    out = backend.allocate_tensor(1024, dtype=torch.float32, device=CUDA)
    out.fill_(GARBAGE)
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out, torch.arange(1024.0, device=CUDA))


def test_registering_before_the_communicator_exists_is_refused(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("streamnccl", store=store, rank=0, world_size=1)
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(CUDA)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with pytest.raises(ValueError, match="no communicator on cuda:0 yet"):
            backend.register_mem_pool(pool)
        with pytest.raises(NotImplementedError, match="symm=True"):
            backend.register_mem_pool(pool, symm=True)
    finally:
        dist.destroy_process_group()
