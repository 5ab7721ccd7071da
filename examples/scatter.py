"""scatter: rank 0 hands chunk r of a list to rank r."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
chunks = [torch.full((3,), float(r), device=device) for r in range(world_size)]
mine = torch.empty(3, device=device)
dist.scatter(mine, chunks if rank == 0 else None, src=0)
print(f"rank {rank}: {mine.tolist()}")
finish(torch.equal(mine.cpu(), torch.full((3,), float(rank))), "scatter")
