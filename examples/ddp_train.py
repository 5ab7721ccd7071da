"""Train a small MLP with DistributedDataParallel on synthetic regression data.

    torchrun --nproc-per-node 2 examples/ddp_train.py                 # streamnccl
    torchrun --nproc-per-node 2 examples/ddp_train.py --backend gloo  # reference run

Exits non-zero if the ranks end with different parameters or the loss did not go down.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

INPUT_DIM = 8


def target_function(inputs):
    # Built from a fixed seed, so every rank learns the same function from its own samples.
    weights = torch.randn(INPUT_DIM, 1, generator=torch.Generator().manual_seed(0))
    weights /= INPUT_DIM**0.5  # keeps sin() in its smooth range: learnable in a few steps
    return torch.sin(inputs @ weights.to(inputs.device)) + 0.5 * inputs[:, :1]


def make_shard(rank, num_samples, device):
    generator = torch.Generator().manual_seed(1000 + rank)  # a different shard per rank
    inputs = torch.randn(num_samples, INPUT_DIM, generator=generator).to(device)
    return inputs, target_function(inputs)


def mean_over_ranks(value, world_size):
    # ReduceOp.AVG is not supported by every backend (gloo lacks it); SUM is.
    total = value.detach().clone()
    dist.all_reduce(total)
    return total.item() / world_size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="streamnccl")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    if "streamnccl" in args.backend:
        import streamnccl  # noqa: F401  (registers the backend with torch.distributed)

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.device_count() >= world_size
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # so collectives and streams use this rank's GPU
    dist.init_process_group(args.backend)
    if rank == 0:
        print(f"backend {args.backend}, device {device.type}, {world_size} ranks", flush=True)

    # Seeded per rank on purpose: DDP must broadcast rank 0's initial weights to the others.
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(INPUT_DIM, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    inputs, targets = make_shard(rank, args.steps * args.batch_size, device)

    losses = []
    for step, batch in enumerate(torch.arange(len(inputs)).split(args.batch_size)):
        loss = nn.functional.mse_loss(model(inputs[batch]), targets[batch])
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        losses.append(mean_over_ranks(loss, world_size))
        if rank == 0:
            print(f"step {step:3d}  loss {losses[-1]:.5f}", flush=True)

    # Exact equality: every rank applied the same averaged gradients to the same weights.
    flat_params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat_params) for _ in range(world_size)]
    dist.all_gather(gathered, flat_params)
    differing_ranks = [r for r, other in enumerate(gathered) if not torch.equal(other, gathered[0])]
    identical = not differing_ranks
    loss_went_down = losses[-1] < losses[0]  # losses are all-reduced: every rank agrees
    if rank == 0:
        print(
            f"parameters identical on all {world_size} ranks"
            if identical
            else f"parameters DIFFER: ranks {differing_ranks} do not match rank 0"
        )
        print(
            f"loss {'went down' if loss_went_down else 'did NOT go down'}: "
            f"{losses[0]:.5f} -> {losses[-1]:.5f}"
        )
    dist.destroy_process_group()
    sys.exit(0 if identical and loss_went_down else 1)


if __name__ == "__main__":
    main()
