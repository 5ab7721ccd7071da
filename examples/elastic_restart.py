"""Resume training after torchelastic restarts the workers.

    torchrun --nproc-per-node 2 --max-restarts 1 examples/elastic_restart.py CHECKPOINT

Rank 0 saves a checkpoint after every step. In the first attempt rank 1 dies at step --die-at;
torchrun stops the others and starts every worker again, which resume from the checkpoint and
finish. Exits non-zero if the ranks end with different parameters.
"""

import argparse
import os

import streamnccl  # noqa: F401  (registers the backend with torch.distributed)
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--die-at", type=int, default=5)
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("streamnccl")
    rank = dist.get_rank()

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank}, attempt {attempt}: resumed at step {start}", flush=True)
    model = DistributedDataParallel(module)

    for step in range(start, args.steps):
        if attempt == 0 and rank == 1 and step == args.die_at:
            os._exit(1)  # a crash: torchrun restarts every worker
        inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(100 * step + rank))
        optimizer.zero_grad()
        model(inputs).sin().pow(2).mean().backward()
        optimizer.step()
        if rank == 0:  # written whole, then renamed: a crash never leaves half a checkpoint
            state = {"model": module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "step": step + 1}, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
        dist.barrier()  # no rank runs ahead of the checkpoint

    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(flat, other) for other in gathered)
    if rank == 0:
        print(f"attempt {attempt} finished: parameters {'identical' if identical else 'DIFFER'}")
    dist.destroy_process_group()
    raise SystemExit(0 if identical else 1)


if __name__ == "__main__":
    main()
