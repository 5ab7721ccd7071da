"""NCCL's memory through streamnccl, over the fake GPU: the group's allocator (ncclMemAlloc,
allocate_tensor), and the registration of memory with the group's communicator
(ncclCommRegister, what register_mem_pool does with a pool's segments). The fake's
registration model (FakeNcclMemory) catches what NCCL would get wrong silently: memory freed
while registered, deregistration under a queued kernel, handles deregistered twice or on
another communicator. The same on a GPU, with torch.cuda.MemPool: tests/gpu/test_gpu_memory.py."""

import gc
import threading
import time
from datetime import timedelta

import pytest
import streamnccl  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
from fakes import (
    connect,
    fake_group,
    fake_ranks,
    fake_world,
    needs_nccl_path,
    opts,
    run_ranks,
    settle,
    shut_down,
)
from streamnccl import _testing
from torch._C._distributed_c10d import AllreduceOptions

CPU = torch.device("cpu")
NCCL_INVALID_USAGE = 5


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _testing.FakeGpu.forget_thread_device()


def segment(tensor):
    return (tensor.data_ptr(), tensor.untyped_storage().nbytes())


def nccl_calls(gpu):
    return [c.split("(")[0] for c in gpu.calls() if "Mem" in c or "egister" in c]


@needs_nccl_path
def test_allocated_registered_memory_carries_a_collective_and_is_let_go_in_order():
    pg, gpu = fake_group()  # three ranks, the others mirrors of this one
    pg.eager_connect_single_device(CPU)
    assert pg.supports_tensor_alloc(CPU)
    x = pg.allocate_tensor(16, dtype=torch.float32, device=CPU)
    assert x.shape == (16,) and x.dtype == torch.float32 and x.device == CPU
    x.copy_(torch.arange(16.0))
    pg._register_memory(CPU, [segment(x)])
    pg.allreduce([x], opts(AllreduceOptions)).wait()
    pg._deregister_memory(CPU, [x.data_ptr()])
    assert gpu.synchronize()
    assert torch.equal(x, torch.arange(16.0) * 3)
    pg._stats()  # lets go of the op's tensors (the watchdog never drops a last reference)
    del x
    gc.collect()
    assert settle(gpu) == []
    assert nccl_calls(gpu) == [
        "ncclMemAlloc",
        "ncclCommRegister",
        "ncclCommDeregister",
        "ncclMemFree",
    ]
    assert "ncclAllReduce" in " ".join(gpu.calls())


@needs_nccl_path
def test_deregistration_waits_for_an_async_op_still_running_on_the_memory():
    # The op's kernel is held on the GPU when deregistration is asked for: it must not go to
    # NCCL until the kernel ran, or NCCL would unmap the memory under it.
    pg, gpu = fake_group()
    pg.eager_connect_single_device(CPU)
    x = pg.allocate_tensor(8, dtype=torch.float32, device=CPU)
    x.fill_(1.0)
    pg._register_memory(CPU, [segment(x)])
    gpu.hold_events(True)
    work = pg.allreduce([x], opts(AllreduceOptions))
    threading.Timer(0.5, gpu.hold_events, args=(False,)).start()
    pg._deregister_memory(CPU, [x.data_ptr()])
    assert work.is_completed()
    work.wait()
    assert torch.equal(x, torch.full((8,), 3.0))
    del x
    assert settle(gpu) == []


@needs_nccl_path
def test_registration_memory_freed_while_registered_is_reported():
    pg, gpu = fake_group()
    pg.eager_connect_single_device(CPU)
    x = pg.allocate_tensor(8, dtype=torch.float32, device=CPU)
    pg._register_memory(CPU, [segment(x)])
    del x  # ncclMemFree, with the registration still in place
    gc.collect()
    violations = settle(gpu)
    assert any("while it is still registered with C0" in v for v in violations), violations


def _deregister_past_a_sync_op(rank, pg, gpu, deregistering):
    x = pg.allocate_tensor(4, dtype=torch.float32, device=CPU)
    x.fill_(rank + 1.0)
    pg._register_memory(CPU, [segment(x)])
    if rank == 0:
        # A sync op on a stream of the caller's own, whose kernel waits for rank 1's: the
        # deregistration, asked from another stream, waits for it all the same.
        gpu.use_stream(5)
        pg.allreduce([x], opts(AllreduceOptions, async_op=False))
        gpu.use_stream(0)
        deregistering.set()
        pg._deregister_memory(CPU, [x.data_ptr()])
        ran = gpu.ran()
    else:
        assert deregistering.wait(timeout=20)
        time.sleep(0.3)  # rank 0 is deregistering by now, or waiting to
        pg.allreduce([x], opts(AllreduceOptions, async_op=False))
        pg._deregister_memory(CPU, [x.data_ptr()])
        ran = None
    assert gpu.synchronize()
    result = x.clone()
    pg._stats()
    del x
    return result, ran


@needs_nccl_path
def test_deregistration_waits_for_a_sync_op_queued_on_another_stream():
    groups = connect(fake_ranks(2))
    deregistering = threading.Event()
    results = run_ranks(
        groups, lambda rank, pg, gpu: _deregister_past_a_sync_op(rank, pg, gpu, deregistering)
    )
    assert [r.tolist() for r, _ in results] == [[3.0] * 4, [3.0] * 4]
    assert "S5 ncclAllReduce" in results[0][1]  # it ran before deregistration returned
    assert settle(groups[0][1]) == []
    assert settle(groups[1][1]) == []
    shut_down(groups)


@needs_nccl_path
def test_registration_deregistering_under_a_queued_kernel_is_reported():
    # NCCL's calls made directly, as the product never makes them: the kernel of a collective
    # on the registered memory is still queued when the memory is deregistered.
    pg, gpu = fake_group()  # only for its GPU
    nccl = _testing.FakeNccl(fake_world(), gpu)
    comm = nccl.init_alone()
    ptr = nccl.mem_alloc(64)
    handle = nccl.register(comm, ptr, 64)
    gpu.hold_events(True)
    assert nccl.all_reduce(comm, ptr, 16) == 0
    assert nccl.deregister(comm, handle) == 0
    gpu.hold_events(False)
    assert gpu.synchronize()
    violations = gpu.violations()
    assert any(
        "while a kernel of C0 that uses the memory is still queued" in v for v in violations
    ), violations
    nccl.destroy(comm)
    assert nccl.mem_free(ptr) == 0


@needs_nccl_path
def test_registration_a_handle_deregistered_twice_or_on_another_communicator_is_reported():
    pg, gpu = fake_group()  # only for its GPU; the calls go to NCCL directly
    nccl = _testing.FakeNccl(fake_world(), gpu)
    first, second = nccl.init_alone(), nccl.init_alone()
    ptr = nccl.mem_alloc(64)
    handle = nccl.register(first, ptr, 64)
    assert nccl.register(first, ptr + 16, 16) == handle  # covered: the same handle, counted
    assert nccl.deregister(second, handle) == NCCL_INVALID_USAGE
    assert nccl.deregister(first, handle) == 0
    assert nccl.deregister(first, handle) == 0
    assert nccl.deregister(first, handle) == NCCL_INVALID_USAGE
    assert nccl.mem_free(ptr) == 0
    violations = gpu.violations()
    assert any("the handle was made on C0, not this communicator" in v for v in violations), (
        violations
    )
    assert any("deregistered already, as often as it was registered" in v for v in violations), (
        violations
    )
    nccl.destroy(first)
    nccl.destroy(second)


@needs_nccl_path
def test_a_destroyed_communicator_releases_its_registrations():
    pg, gpu = fake_group()
    nccl = _testing.FakeNccl(fake_world(), gpu)
    comm = nccl.init_alone()
    ptr = nccl.mem_alloc(64)
    nccl.register(comm, ptr, 64)
    nccl.destroy(comm)
    assert nccl.mem_free(ptr) == 0  # NCCL released the registration with the communicator
    assert gpu.violations() == []


@needs_nccl_path
def test_memory_calls_are_refused_with_a_reason():
    pg, gpu = fake_group()
    with pytest.raises(ValueError, match="no communicator on cpu yet; connect it first"):
        pg._register_memory(CPU, [(1 << 20, 64)])
    pg.eager_connect_single_device(CPU)
    with pytest.raises(ValueError, match="is not registered with this group's communicator"):
        pg._deregister_memory(CPU, [1 << 20])
    with pytest.raises(ValueError, match="size is -1"):
        pg.allocate_tensor(-1, dtype=torch.float32, device=CPU)
    x = pg.allocate_tensor(4, dtype=torch.float32, device=CPU)
    pg._register_memory(CPU, [segment(x)])
    with pytest.raises(ValueError, match="registered with this group's communicator already"):
        pg._register_memory(CPU, [segment(x)])
    pg._deregister_memory(CPU, [x.data_ptr()])
    assert settle(gpu) == []


@needs_nccl_path
def test_an_nccl_without_mem_alloc_allocates_nothing():
    pg, gpu = fake_group()
    gpu.set_nccl_version(21805)
    assert not pg.supports_tensor_alloc(CPU)
    with pytest.raises(ValueError, match=r"no ncclMemAlloc and ncclCommRegister \(NCCL 2.19\+\)"):
        pg.allocate_tensor(4, dtype=torch.float32, device=CPU)
    with pytest.raises(RuntimeError, match="streamnccl.*getMemAllocator.*NCCL 2.19"):
        pg.mem_allocator  # noqa: B018


@needs_nccl_path
def test_a_broken_group_has_nothing_left_to_deregister():
    pg, gpu = fake_group(timeout=timedelta(seconds=5))
    pg.eager_connect_single_device(CPU)
    x = pg.allocate_tensor(4, dtype=torch.float32, device=CPU)
    pg._register_memory(CPU, [segment(x)])
    pg.abort()  # ncclCommAbort releases the registrations
    pg._deregister_memory(CPU, [x.data_ptr()])
    del x
    gc.collect()
    assert settle(gpu) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU allocates: tests/gpu/ test that")
def test_without_a_gpu_the_backend_allocates_nothing_and_says_why(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("streamnccl", store=store, rank=0, world_size=1)
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(CPU)
        assert not backend.supports_tensor_alloc(torch.device("cuda", 0))
        assert not backend.supports_tensor_alloc(CPU)
        with pytest.raises(RuntimeError, match="streamnccl.*getMemAllocator"):
            backend.mem_allocator  # noqa: B018
        with pytest.raises(ValueError, match="streamnccl allocate_tensor"):
            backend.allocate_tensor(4, dtype=torch.float32, device=CPU)
    finally:
        dist.destroy_process_group()
