"""all_gather: every rank ends with every rank's tensor, as a list and as one tensor."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
mine = torch.tensor([rank, rank * 10], device=device)
as_list = [torch.empty_like(mine) for _ in range(world_size)]
dist.all_gather(as_list, mine)
as_tensor = torch.empty(world_size * 2, dtype=mine.dtype, device=device)
dist.all_gather_into_tensor(as_tensor, mine)
expected = torch.tensor([[r, r * 10] for r in range(world_size)])
print(f"rank {rank}: {[t.tolist() for t in as_list]}")
ok = torch.equal(torch.stack(as_list).cpu(), expected)
finish(ok and torch.equal(as_tensor.cpu(), expected.reshape(-1)), "all_gather")
