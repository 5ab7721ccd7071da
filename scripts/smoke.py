"""The smoke test of an installed streamnccl, one rank of it:
`python -m torch.distributed.run --nproc-per-node 2 scripts/smoke.py` (scripts/check-torch.sh
runs it). Registers the backend, joins the group, and checks an all_reduce on CPU, a barrier
naming a device as a trainer does, and an async all_gather against their closed forms."""

import os

import streamnccl
import torch
import torch.distributed as dist

dist.init_process_group("streamnccl")
rank, size = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "streamnccl", dist.get_backend()

x = torch.arange(4, dtype=torch.float32) + rank
dist.all_reduce(x)
expected = size * torch.arange(4, dtype=torch.float32) + sum(range(size))
assert torch.equal(x, expected), (x, expected)

dist.barrier(device_ids=[int(os.environ.get("LOCAL_RANK", 0))])

gathered = torch.empty(size, dtype=torch.int64)
dist.all_gather_into_tensor(gathered, torch.tensor([rank * 10]), async_op=True).wait()
assert gathered.tolist() == [r * 10 for r in range(size)], gathered

dist.destroy_process_group()
if rank == 0:
    print(f"smoke: ok (streamnccl {streamnccl.__version__}, torch {torch.__version__})")
