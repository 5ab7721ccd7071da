"""reduce_scatter: chunk r of the sum over ranks lands on rank r."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
# Every rank contributes [0, 1, ..., 2n-1] + rank; rank r keeps chunk r of the sum.
contribution = torch.arange(2.0 * world_size, device=device) + rank
mine = torch.empty(2, device=device)
dist.reduce_scatter_tensor(mine, contribution)
offset = world_size * (world_size - 1) / 2
expected = torch.arange(2.0 * rank, 2.0 * rank + 2) * world_size + offset
print(f"rank {rank}: {mine.tolist()}")
finish(torch.equal(mine.cpu(), expected), "reduce_scatter")
