"""shrink_group on streamnccl groups: torch's part, corrected for a backend of its own kind.

torch.distributed.shrink_group asks the backend to shrink (ProcessGroup.shrink, in C++), then
wraps the new backend in a ProcessGroup of its own making. torch 2.11 registers it there as
BackendType.GLOO for a CPU group (NCCL for a CUDA one), as if gloo or nccl had made it; a
registered backend is BackendType.CUSTOM everywhere else. Code that trusts the type then reads
streamnccl's options as gloo's: DDP's constructor (c10d::Logger) crashes on it. So the wrapper
is registered again here as what it is, for every device type streamnccl serves, as
init_process_group registers it. Other backends' groups pass through untouched.
"""

import torch
import torch.distributed.distributed_c10d as c10d

from ._C import ProcessGroup

_DEVICES = ("cpu", "cuda")


def _registered_as_custom(create_shrunk_process_group):
    def create(new_backend, remaining_ranks, metadata, is_default_group):
        group = create_shrunk_process_group(
            new_backend, remaining_ranks, metadata, is_default_group
        )
        if isinstance(new_backend, ProcessGroup):
            custom = c10d.ProcessGroup.BackendType.CUSTOM
            for device in _DEVICES:
                group._register_backend(torch.device(device), custom, new_backend)
            group._set_default_backend(custom)
        return group

    create.__wrapped__ = create_shrunk_process_group
    return create


def install():
    """Puts the correction in torch's shrink_group (once)."""
    current = getattr(c10d, "_create_shrunk_process_group", None)
    if current is not None and not hasattr(current, "__wrapped__"):
        c10d._create_shrunk_process_group = _registered_as_custom(current)
