from collections.abc import Callable
from datetime import timedelta
from typing import overload

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ErrorType

class NcclConfig:
    """How NCCL makes a group's communicators (ncclConfig_t); unset fields are NCCL's defaults."""

    blocking: bool | None
    cga_cluster_size: int | None
    min_ctas: int | None
    max_ctas: int | None
    net_name: str | None
    split_share: bool | None
    def __init__(
        self,
        *,
        blocking: bool | None = None,
        cga_cluster_size: int | None = None,
        min_ctas: int | None = None,
        max_ctas: int | None = None,
        net_name: str | None = None,
        split_share: bool | None = None,
    ) -> None: ...

class Options(dist.Backend.Options):
    """Settings of a streamnccl group; unset ones come from STREAMNCCL_* variables."""

    high_priority_streams: bool | None
    blocking_wait: bool | None
    dump_dir: str | None
    trace_buffer_size: int | None
    debug_checks: bool | None
    enable_timing: bool | None
    single_hardware_queue: bool | None
    check_inflight_writes: bool | None
    propagate_errors: bool | None
    config: NcclConfig
    def __init__(
        self,
        *,
        high_priority_streams: bool | None = None,
        blocking_wait: bool | None = None,
        dump_dir: str | None = None,
        trace_buffer_size: int | None = None,
        debug_checks: bool | None = None,
        enable_timing: bool | None = None,
        single_hardware_queue: bool | None = None,
        check_inflight_writes: bool | None = None,
        config: NcclConfig | None = None,
        propagate_errors: bool | None = None,
    ) -> None: ...
    def resolved(self) -> Options: ...
    def __copy__(self) -> Options: ...
    def __deepcopy__(self, memo: dict) -> Options: ...

class Work(dist.Work):
    """What an op returns: c10d's Work, whose wait() keeps the GIL where it returns at once."""

    def wait(self, timeout: timedelta = ...) -> bool: ...

class ProcessGroup(dist.Backend):
    @overload
    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        options: Options,
        *,
        open_gloo: Callable[[dist.Store, int, int, timedelta], dist.Backend],
        group_name: str = "",
    ) -> None: ...
    @overload
    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        options: Options,
        gloo: dist.Backend,
        group_name: str = "",
    ) -> None: ...
    @property
    def streamnccl_options(self) -> Options: ...
    @property
    def options(self) -> Options: ...
    def perform_nocolor_split(self, device: torch.device) -> None: ...
    def _split_without(self, device: torch.device, agreement: str) -> None: ...
    def _refuse_split(self, agreement: str, why: str) -> None: ...
    # The pool's segments with the group's NCCL communicator of the pool's device (built
    # with the NCCL path only), as ProcessGroupNCCL's; symm=True is not supported.
    def register_mem_pool(self, pool: torch.cuda.MemPool, symm: bool = False) -> None: ...
    def deregister_mem_pool(self, pool: torch.cuda.MemPool) -> None: ...
    # The same for (address, bytes) segments of memory on `device`.
    def _register_memory(self, device: torch.device, segments: list[tuple[int, int]]) -> None: ...
    def _deregister_memory(self, device: torch.device, addresses: list[int]) -> None: ...
    def _set_global_ranks(self, global_ranks: list[int]) -> None: ...
    def _stats(self) -> dict[str, dict[str, int | float]]: ...
    def _reset_stats(self) -> None: ...
    def get_error(self) -> ErrorType: ...
    def _split(
        self,
        store: dist.Store,
        ranks: list[int],
        options: Options | None = None,
        agreement: str = "",
    ) -> ProcessGroup | None: ...

def _build_info() -> dict: ...
def _dump_flight_recorder() -> bytes: ...
def _store_of_this_attempt(store: dist.Store) -> dist.Store: ...
def _shutdown_all_groups() -> None: ...
