"""reduce: the sum over ranks arrives on rank 0 only; the others keep their input."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
tensor = torch.full((3,), float(rank + 1), device=device)
dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM)
expected = world_size * (world_size + 1) / 2 if rank == 0 else rank + 1
print(f"rank {rank}: {tensor.tolist()}")
finish(torch.equal(tensor.cpu(), torch.full((3,), float(expected))), "reduce")
