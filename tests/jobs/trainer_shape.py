"""Run under torchrun: a trainer of the shape third-party libraries give it (HF Accelerate's
`wait_for_everyone()` is `dist.barrier(device_ids=[local_rank])`, whatever the device). It joins
the group, waits for everyone so, takes a few DDP steps on CPU, waits again, and prints the
parameters on rank 0 for tests/test_trainer_shape.py to hold against gloo's.

    torchrun --nproc-per-node 2 tests/jobs/trainer_shape.py --backend streamnccl
"""

import argparse
import json
import os

import streamnccl  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--backend", required=True)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group(args.backend)
rank = dist.get_rank()
dist.barrier(device_ids=[local_rank])  # the trainer's wait_for_everyone()

torch.manual_seed(0)  # the same initial model on every rank and backend
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)  # a shard of its own per rank
for _ in range(args.steps):
    inputs = torch.randn(32, 8, generator=data)
    loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

dist.barrier(device_ids=[local_rank])
if rank == 0:
    parameters = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("parameters:", json.dumps(parameters.tolist()), flush=True)
dist.destroy_process_group()
