"""Streams and events: an async all_reduce overlaps independent compute.

async_op=True returns at once; on CUDA the op runs on streamnccl's internal stream, behind
an event on the caller's stream, so the matmul below runs concurrently. work.wait() then
makes the caller's stream wait for the op without blocking the host. On CPU the op runs on
the group's worker thread while this thread computes, and wait() blocks until it is done."""

import time

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
gradients = torch.ones(4_000_000, device=device)
weights = torch.randn(512, 512, device=device)

started = time.perf_counter()
work = dist.all_reduce(gradients, async_op=True)  # returns at once
for _ in range(20):
    weights = torch.tanh(weights @ weights.T / 512)  # independent of `gradients`
launched = time.perf_counter() - started
work.wait()  # reads of `gradients` after this see the reduced values
total = gradients.sum().item()  # ordered after the op by wait()
print(f"rank {rank}: compute ran while the all_reduce was in flight "
      f"({launched * 1000:.0f} ms), then wait()")  # fmt: skip
finish(total == world_size * gradients.numel(), "overlap: async all_reduce with compute")
