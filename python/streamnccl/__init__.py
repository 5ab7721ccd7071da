"""streamnccl: a torch.distributed backend with explicit stream semantics.

Importing this package registers the backend ``"streamnccl"`` for cpu and cuda tensors::

    import streamnccl
    torch.distributed.init_process_group("streamnccl")
"""

import atexit
import os
import pickle
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def _check_built_against_this_torch() -> None:
    """A C++ extension runs only with the torch it was built against: with another, it fails
    at an undefined symbol, or worse, loads and misreads torch's types. Said plainly instead."""
    try:
        from ._build_info import TORCH_VERSION as built_against
    except ImportError:
        raise ImportError(
            "streamnccl is not built: its extension and streamnccl/_build_info.py are made by "
            "`pip install --no-build-isolation .` (or scripts/setup.sh)"
        ) from None
    if built_against != torch.__version__:
        raise ImportError(
            f"streamnccl was built against torch {built_against}, but torch {torch.__version__} "
            "is running. A C++ extension must be built against the torch it runs with: rebuild "
            "it in this environment (`pip install --no-build-isolation --force-reinstall "
            "--no-deps .` in streamnccl's checkout, or scripts/setup.sh)."
        )


_check_built_against_this_torch()

from . import _C, _shrink  # noqa: E402  (after the check: loading _C may fail without it)
from ._C import NcclConfig, Options, ProcessGroup  # noqa: E402

__all__ = [
    "NcclConfig",
    "Options",
    "ProcessGroup",
    "dump_flight_recorder",
    "flight_recorder",
    "info",
    "reset_stats",
    "stats",
]
__version__ = _C._build_info()["version"]


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
    # torch calls this creator from where it makes the group, whose locals name it.
    parent = _split_source(sys._getframe(1).f_locals)
    agreement = f"new_group/{dist_backend_opts.group_id}"
    try:
        if pg_options is None:
            pg_options = Options()
        if not isinstance(pg_options, Options):
            raise TypeError(
                "streamnccl: pg_options must be a streamnccl.Options, got "
                f"{type(pg_options).__name__}"
            )
        resolved = Options.resolved(pg_options)  # refuses what streamnccl cannot honour
    except (TypeError, ValueError) as refused:
        if parent is not None:  # the ranks outside the group wait for a split: end it
            try:
                parent._refuse_split(agreement, f"new_group's pg_options were refused: {refused}")
            except Exception:  # noqa: BLE001 (the refusal is what the caller must see)
                pass
        raise
    store = dist_backend_opts.store
    rank = dist_backend_opts.group_rank
    size = dist_backend_opts.group_size
    timeout = dist_backend_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    global_ranks = list(getattr(dist_backend_opts, "global_ranks_in_group", []) or [])
    if len(global_ranks) != size:
        global_ranks = list(range(size))

    def open_gloo(gloo_store, gloo_rank, gloo_size, gloo_timeout) -> "dist.ProcessGroupGloo":
        """The host path's Gloo for this group or a subgroup split from it, which each makes at
        its first CPU op (never, for a group used only for CUDA tensors)."""
        return dist.ProcessGroupGloo(gloo_store, gloo_rank, gloo_size, _gloo_options(gloo_timeout))

    if parent is not None:
        # The subgroup's communicator is split from the default group's (ncclCommSplit), where
        # that is live on every rank; the ranks outside it take part (perform_nocolor_split),
        # and all meet under the group's name. Its ranks are the default group's, so global.
        resolved._timeout = timeout
        resolved.group_name = dist_backend_opts.group_id
        # (The split keeps to this attempt's keys itself, as split_group's does.)
        return parent._split(store, global_ranks, resolved, agreement=agreement)
    # torchelastic's restarted workers meet in the same store as the attempt before them, whose
    # keys are still there: Gloo would read the dead workers' addresses, and the NCCL path
    # their unique ids. Each attempt keeps to keys of its own.
    store = _C._store_of_this_attempt(store)
    # group_id is torch's name for the group ("0", "1", ...): NCCL's logs name it so.
    group = ProcessGroup(
        store, rank, size, timeout, pg_options,
        open_gloo=open_gloo, group_name=dist_backend_opts.group_id,
    )  # fmt: skip
    group._set_global_ranks(global_ranks)
    return group


def _split_source(maker: dict) -> ProcessGroup | None:
    """The group a new group is split from, where its making (torch's _new_process_group_helper,
    whose locals are `maker`) has every rank of the default group take part in a split of it:
    torch's own choice of split source (its local `split_from`, the default group's backend of
    its bound device, in every release from 2.11 to 2.15), when that is a streamnccl group and
    the new group's backend for that device is streamnccl too (torch 2.15 checks this itself;
    2.11 to 2.14 split from the default group whatever the new group's backend). Decided the
    same way on the ranks in the new group (its creator) and outside it (perform_nocolor_split).
    Not for the default group itself, nor for a group made with use_local_synchronization, which
    torch names by a hash and whose ranks outside it never call new_group."""
    source, group_name, backend = (maker.get(k) for k in ("split_from", "group_name", "backend"))
    if not isinstance(source, ProcessGroup):
        return None
    if getattr(dist.distributed_c10d, "_use_torchcomms_enabled", lambda: False)():
        return None  # torch 2.14+ with TorchComms: the ranks outside split nothing
    if not isinstance(group_name, str) or not group_name.isdigit() or backend is None:
        return None
    device = dist.distributed_c10d._get_default_group().bound_device_id
    devices = dist.distributed_c10d.BackendConfig(dist.Backend(backend)).get_device_backend_map()
    if device is None or devices.get(device.type) != "streamnccl":
        return None  # its members never reach streamnccl's creator
    return source


def _perform_nocolor_split(self: ProcessGroup, device: torch.device) -> None:
    """What torch's new_group calls, on a bound default group's backend, on the ranks outside
    the new group: their part in the split its members make (see _split_source)."""
    maker = sys._getframe(1).f_locals
    if _split_source(maker) is self:
        self._split_without(device, agreement=f"new_group/{maker['group_name']}")


ProcessGroup.perform_nocolor_split = _perform_nocolor_split


def _gloo_options(timeout: timedelta) -> "dist.ProcessGroupGloo._Options":
    """Gloo's options as torch makes them for a gloo group: its devices from GLOO_SOCKET_IFNAME,
    else the default, and two worker threads per device. With one, a 16 MiB all_reduce took 7%
    longer than gloo's (`python -m streamnccl.bench --op all_reduce -b 16M -e 16M`, under
    torchrun, 2 ranks on CPU), though the group runs one collective at a time. Unlike torch's,
    its devices connect a pair of ranks at their first exchange (lazy_init): Gloo is opened at
    each member's first CPU op, and a first send must not wait for members that never make one."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    interfaces = [name for name in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if name]
    if interfaces:
        options._devices = [
            dist.ProcessGroupGloo.create_device(interface=i, lazy_init=True) for i in interfaces
        ]
    else:
        options._devices = [dist.ProcessGroupGloo.create_default_device(lazy_init=True)]
    options._threads = 2 * len(options._devices)
    return options


def dump_flight_recorder(path: str | os.PathLike | None = None) -> bytes:
    """This process's flight recorder: the latest ops of every streamnccl group and their states.

    The bytes are a pickle in the format of torch's own flight recorder (ProcessGroupNCCL's), so
    torch's analyzer reads a folder of them, one per rank named ``<prefix><global rank>``:
    ``python -m torch.distributed.flight_recorder.fr_trace FOLDER``. With ``path``, they are also
    written there. A group that breaks writes the same to
    ``<dump_dir>/streamnccl_trace_rank_<global rank>`` by itself.
    """
    dump = _C._dump_flight_recorder()
    if path is not None:
        with open(path, "wb") as file:
            file.write(dump)
    return dump


def flight_recorder() -> dict:
    """The flight recorder as a dict (see dump_flight_recorder); json.dumps writes it as JSON."""
    return pickle.loads(_C._dump_flight_recorder())


def _backend_of(group) -> ProcessGroup:
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    if not isinstance(backend, ProcessGroup):
        raise ValueError(
            f"streamnccl: the group's backend is {type(backend).__name__}, not streamnccl"
        )
    return backend


def stats(group=None) -> dict:
    """Per op kind of ``group`` (default: the default group) since the last reset_stats().

    Each kind ("all_reduce", "broadcast", ...) maps to ``count``, ``bytes`` (each op counts the
    larger of its input and output on this rank, as nccl-tests sizes a message), ``failures`` and
    ``in_flight``; with timing on (``Options(enable_timing=True)`` or STREAMNCCL_ENABLE_TIMING=1)
    also ``timed``, ``total_ms``, ``mean_ms``, and ``p50_ms`` and ``p99_ms`` over the latest 4096.
    """
    return _backend_of(group)._stats()


def reset_stats(group=None) -> None:
    """Starts the counts of stats() afresh (ops still in flight stay counted as such)."""
    _backend_of(group)._reset_stats()


# Groups still alive at exit (a model holding one, say) are shut down as destroy_process_group()
# would: their ops in flight finish first. Before the interpreter finalizes, since a thread that
# drops a tensor then can no longer take the GIL.
atexit.register(_C._shutdown_all_groups)


dist.Backend.register_backend(
    "streamnccl", _create_backend, extended_api=True, devices=["cpu", "cuda"]
)
# streamnccl records its own ops, in torch's format (dump_flight_recorder). torch 2.15 attaches
# a flight recorder hook of its own to the groups of every backend not in this set, which would
# record each op a second time, at a cost on every launch.
getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", set()).add("streamnccl")
_shrink.install()
