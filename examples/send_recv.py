"""send/recv and isend/irecv: a token travels around a ring; every rank passes its rank to the
right with isend/irecv, posting the recv first; then every rank swaps with both neighbours
at once through batch_isend_irecv (one group, one Work)."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
right, left = (rank + 1) % world_size, (rank - 1) % world_size

# Blocking: rank 0 starts the token, each rank adds one and passes it on.
token = torch.zeros(1, device=device)
if rank != 0:
    dist.recv(token, src=left)
token += 1
dist.send(token, dst=right)
if rank == 0:
    dist.recv(token, src=left)
ring_ok = rank != 0 or token.item() == world_size

# Non-blocking: isend and irecv return Works; wait on them before reading. The recv may be
# posted first: sends and recvs run on separate lanes per peer.
passed = torch.empty(1, device=device)
pending = dist.irecv(passed, src=left)
dist.isend(torch.tensor([float(rank)], device=device), dst=right).wait()
pending.wait()
pass_ok = passed.item() == left

# Batched: one group, one Work.
from_left = torch.empty(1, device=device)
from_right = torch.empty(1, device=device)
ops = [
    dist.P2POp(dist.isend, torch.tensor([float(rank)], device=device), right),
    dist.P2POp(dist.isend, torch.tensor([float(rank)], device=device), left),
    dist.P2POp(dist.irecv, from_left, left),
    dist.P2POp(dist.irecv, from_right, right),
]
for work in dist.batch_isend_irecv(ops):
    work.wait()
swap_ok = from_left.item() == left and from_right.item() == right
print(f"rank {rank}: token {token.item():.0f}, from left {from_left.item():.0f}, "
      f"from right {from_right.item():.0f}")  # fmt: skip
finish(ring_ok and pass_ok and swap_ok, "send/recv and isend/irecv")
