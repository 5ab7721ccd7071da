"""broadcast: rank 0's tensor is copied to every rank."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
tensor = torch.arange(4.0, device=device) if rank == 0 else torch.zeros(4, device=device)
dist.broadcast(tensor, src=0)
print(f"rank {rank}: {tensor.tolist()}")
finish(torch.equal(tensor.cpu(), torch.arange(4.0)), "broadcast")
