"""What every example does first: join the group on the streamnccl backend, on this rank's GPU
when there is one GPU per rank, else on CPU. Run an example with
`torchrun --nproc-per-node 2 examples/<name>.py`."""

import os

import streamnccl  # noqa: F401  (registers the "streamnccl" backend)
import torch
import torch.distributed as dist


def start():
    """Initialises the default group; returns (rank, world_size, device)."""
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.device_count() >= world_size:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("streamnccl")
    return dist.get_rank(), world_size, device


def finish(ok, what):
    """Reports on rank 0 and exits non-zero on any rank whose check failed."""
    if dist.get_rank() == 0:
        print(f"{what}: {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)
