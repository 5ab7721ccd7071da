"""gather: rank 0 collects one tensor from every rank."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
mine = torch.full((2,), float(rank * rank), device=device)
collected = [torch.empty(2, device=device) for _ in range(world_size)] if rank == 0 else None
dist.gather(mine, collected, dst=0)
ok = True
if rank == 0:
    print("rank 0 gathered:", [t.tolist() for t in collected])
    ok = all(torch.equal(t.cpu(), torch.full((2,), float(r * r))) for r, t in enumerate(collected))
finish(ok, "gather")
