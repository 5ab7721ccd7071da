from datetime import timedelta

import torch.distributed as dist

class Options(dist.Backend.Options):
    """Settings of a streamnccl group; unset ones come from STREAMNCCL_* variables."""

    high_priority_streams: bool | None
    blocking_wait: bool | None
    def __init__(
        self, *, high_priority_streams: bool | None = None, blocking_wait: bool | None = None
    ) -> None: ...
    def resolved(self) -> Options: ...

class ProcessGroup(dist.Backend):
    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        options: Options,
        gloo: dist.Backend,
    ) -> None: ...
    @property
    def streamnccl_options(self) -> Options: ...

def _build_info() -> dict: ...
