"""Keep training when a rank dies: the survivors shrink the group around it and go on.

    torchrun --nproc-per-node 4 examples/shrink_on_failure.py                 # streamnccl
    torchrun --nproc-per-node 4 examples/shrink_on_failure.py --backend gloo  # gloo cannot

The last rank vanishes in the middle of step --die-at. Every other rank learns it within about
a second, whatever the group's timeout (torch's default here, 30 minutes): those whose
connection to it closes, and through the group's Store the others too, whose op waits on a
rank still alive (streamnccl's error propagation). Each sees its gradient all-reduce fail with
a DistBackendError naming the dead rank, calls torch.distributed.shrink_group([dead rank]),
wraps the model in DDP again over the smaller group, redoes the step and finishes. Each prints
how long after the death its error came, and its first step in the shrunk group. Exits non-zero
if they end with different parameters. With gloo, shrink_group raises TypeError.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

INPUT_DIM = 8


def make_batches(rank, steps, batch_size):
    generator = torch.Generator().manual_seed(1000 + rank)  # a different shard per rank
    inputs = torch.randn(steps, batch_size, INPUT_DIM, generator=generator)
    return inputs, inputs.sum(dim=2, keepdim=True).sin()


def train_step(model, optimizer, inputs, targets):
    optimizer.zero_grad()
    nn.functional.mse_loss(model(inputs), targets).backward()  # DDP all-reduces here
    optimizer.step()


def seconds_since_death(store):
    """How long ago the dying rank noted its death in the Store (one machine's clock, or
    clocks in step)."""
    return time.time() - float(store.get("died_at").decode())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="streamnccl")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--die-at", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if args.backend == "streamnccl":
        import streamnccl  # noqa: F401  (registers the backend with torch.distributed)

    dist.init_process_group(args.backend)  # torch's default timeout: 30 minutes
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dying_rank = world_size - 1
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(INPUT_DIM, 32), nn.Tanh(), nn.Linear(32, 1))
    model = DistributedDataParallel(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    inputs, targets = make_batches(rank, args.steps, args.batch_size)
    store = dist.distributed_c10d._get_default_store()
    shrunk_at = None

    step = 0
    while step < args.steps:
        if rank == dying_rank and step == args.die_at:
            # Gone mid-step, before its share of the gradients. Exit code 0 only so that
            # torchrun's agent, which stops every worker once one fails, leaves the others be.
            store.set("died_at", repr(time.time()))
            os._exit(0)
        try:
            train_step(model, optimizer, inputs[step], targets[step])
        except RuntimeError as error:  # streamnccl: a DistBackendError; gloo: a RuntimeError
            after = seconds_since_death(store)
            what = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            print(
                f"rank {rank}: step {step} failed {after:.2f} s after the death: {what}", flush=True
            )
            dist.shrink_group([dying_rank])  # the default group, now without the dead rank
            print(f"rank {rank}: now rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
            # The failed step left no update behind (it failed before optimizer.step()): a
            # DDP over the new group redoes it.
            model = DistributedDataParallel(module)
            shrunk_at = step
            continue
        if step == shrunk_at:
            after = seconds_since_death(store)
            print(f"rank {rank}: first step of the shrunk group done {after:.2f} s after the death",
                  flush=True)  # fmt: skip
        step += 1

    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(flat, other) for other in gathered)
    if dist.get_rank() == 0:
        survivors = dist.get_world_size()
        print(f"{survivors} ranks finished {args.steps} steps: parameters "
              f"{'identical' if identical else 'DIFFER'}", flush=True)  # fmt: skip
    dist.destroy_process_group()
    raise SystemExit(0 if identical else 1)


if __name__ == "__main__":
    main()
