"""streamnccl: a torch.distributed backend with explicit stream semantics.

Importing this package registers the backend ``"streamnccl"`` for cpu and cuda tensors::

    import streamnccl
    torch.distributed.init_process_group("streamnccl")
"""

import atexit
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C
from ._C import Options, ProcessGroup

__all__ = ["Options", "ProcessGroup", "info"]
__version__ = _C._build_info()["version"]

# Gloo carries the host path; its keys live under the group's store prefix, apart from ours.
_GLOO_STORE_PREFIX = "streamnccl/gloo/"


def info() -> dict:
    """Versions and compiled paths of this installation."""
    build = _C._build_info()
    return {
        "streamnccl": build["version"],
        "torch": torch.__version__,
        "cuda_runtime_of_torch": torch.version.cuda,
        "cuda_compiled": build["cuda_version_compiled"],
        "nccl_compiled": build["nccl_version_compiled"],
        "nccl_loaded": build["nccl_version_loaded"],
        "paths": build["paths"],
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def _create_backend(dist_backend_opts, pg_options) -> ProcessGroup:
    """The creator torch.distributed calls for every group using this backend."""
    if pg_options is None:
        pg_options = Options()
    if not isinstance(pg_options, Options):
        raise TypeError(
            f"streamnccl: pg_options must be a streamnccl.Options, got {type(pg_options).__name__}"
        )
    store = dist_backend_opts.store
    rank = dist_backend_opts.group_rank
    size = dist_backend_opts.group_size
    timeout = dist_backend_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    gloo = dist.ProcessGroupGloo(dist.PrefixStore(_GLOO_STORE_PREFIX, store), rank, size, timeout)
    return ProcessGroup(store, rank, size, timeout, pg_options, gloo)


# Groups still alive at exit (a model holding one, say) have their watchdogs stopped first:
# once the interpreter finalizes, a thread that drops a tensor cannot take the GIL.
atexit.register(_C._stop_all_watchdogs)


dist.Backend.register_backend(
    "streamnccl", _create_backend, extended_api=True, devices=["cpu", "cuda"]
)
