"""Keep training when a rank dies: the survivors shrink the group around it and go on.

    torchrun --nproc-per-node 4 examples/shrink_on_failure.py                 # streamnccl
    torchrun --nproc-per-node 4 examples/shrink_on_failure.py --backend gloo  # gloo cannot

The last rank vanishes in the middle of step --die-at. The others see the failed gradient
all-reduce as a DistBackendError, call torch.distributed.shrink_group([dead rank]), wrap the
model in DDP again over the smaller group, redo the step and finish. Exits non-zero if they end
with different parameters. With gloo, shrink_group raises TypeError: gloo cannot shrink.
"""

import argparse
import os
from datetime import timedelta

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


def shrink_options(args):
    if args.backend != "streamnccl":
        return None  # gloo cannot shrink: torch says so before it reads any options
    import streamnccl

    options = streamnccl.Options()
    options._timeout = timedelta(seconds=2 * args.timeout_s)
    return options


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="streamnccl")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--die-at", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--timeout-s", type=float, default=20)
    args = parser.parse_args()
    if args.backend == "streamnccl":
        import streamnccl  # noqa: F401  (registers the backend with torch.distributed)

    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout_s))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dying_rank = world_size - 1
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(INPUT_DIM, 32), nn.Tanh(), nn.Linear(32, 1))
    model = DistributedDataParallel(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    inputs, targets = make_batches(rank, args.steps, args.batch_size)

    step = 0
    while step < args.steps:
        if rank == dying_rank and step == args.die_at:
            # Gone mid-step, before its share of the gradients. Exit code 0 only so that
            # torchrun's agent, which stops every worker once one fails, leaves the others be.
            os._exit(0)
        try:
            train_step(model, optimizer, inputs[step], targets[step])
        except RuntimeError as error:  # streamnccl: a DistBackendError; gloo: a RuntimeError
            what = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            print(f"rank {rank}: step {step} failed with {what}", flush=True)
            # The default group, now without the dead rank. The survivors learn of the death
            # at different times, up to an op's timeout apart (one from a connection reset at
            # once, another from its own op timing out): the shrink waits twice that for them.
            dist.shrink_group([dying_rank], pg_options=shrink_options(args))
            print(f"rank {rank}: now rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
            # The failed step left no update behind (it failed before optimizer.step()): a
            # DDP over the new group redoes it.
            model = DistributedDataParallel(module)
            continue
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
