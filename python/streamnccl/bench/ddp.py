"""`python -m streamnccl.bench.ddp [--steps N] [--rounds R] [--width W]`: a training step of
DistributedDataParallel, streamnccl against gloo in one run (under torchrun; alone, one rank).

Each backend trains a model of its own, examples/ddp_train.py's MLP (8 inputs, a hidden layer
of `--width`, Tanh, one output) with Adam, from the same weights and on the same batches, in
`--rounds` rounds in which the two take turns for `--steps` steps each: the time of a step
(forward, backward with DDP's gradient all_reduce, optimizer step), each backend's median
over the rounds, and the ratio of streamnccl's to gloo's (median and range). Both must end
with the same parameters, bit for bit (`max_param_difference`): the same training ran on
each. Rank 0 prints one line per backend and the ratio; with --json writes them.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import streamnccl  # noqa: F401  (registers the backend "streamnccl")

from .cli import destroy_groups, init_default_group, paired_arguments, write_results
from .latency import BACKENDS, paired

INPUT_DIM = 8


class Trainer:
    """One backend's DDP model, its optimizer, and where it is in the shared batches."""

    def __init__(self, group, width: int, batches):
        torch.manual_seed(0)  # the same weights for every backend (DDP broadcasts rank 0's)
        model = nn.Sequential(nn.Linear(INPUT_DIM, width), nn.Tanh(), nn.Linear(width, 1))
        self.model = DistributedDataParallel(model, process_group=group)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.batches = batches
        self.step = 0

    def train(self, steps: int) -> dict:
        start = time.perf_counter()
        for _ in range(steps):
            inputs, targets = self.batches[self.step % len(self.batches)]
            loss = nn.functional.mse_loss(self.model(inputs), targets)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.step += 1
        return {"ms_per_step": (time.perf_counter() - start) / steps * 1e3}

    def parameters(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])


def make_batches(rank: int, count: int, size: int):
    generator = torch.Generator().manual_seed(1000 + rank)  # a shard of its own per rank
    batches = []
    for _ in range(count):
        inputs = torch.randn(size, INPUT_DIM, generator=generator)
        batches.append((inputs, torch.sin(inputs.sum(dim=1, keepdim=True))))
    return batches


def main(argv=None) -> int:
    arguments = paired_arguments(__spec__.name, __doc__, steps=50, width=64, batch_size=64)
    args = arguments.parse_args(argv)
    control = init_default_group()
    batches = make_batches(dist.get_rank(), 16, args.batch_size)
    groups = {backend: dist.new_group(backend=backend) for backend in BACKENDS}
    trainers = {backend: Trainer(group, args.width, batches) for backend, group in groups.items()}
    for trainer in trainers.values():  # warm-up: DDP's first iteration builds its buckets
        trainer.train(min(args.steps, 5))
    runs = {backend: lambda t=trainer: t.train(args.steps) for backend, trainer in trainers.items()}
    result = paired(runs, args.rounds, control)
    difference = (trainers["streamnccl"].parameters() - trainers["gloo"].parameters()).abs()
    result["max_param_difference"] = float(difference.max())
    if dist.get_rank() == 0:
        print(f"# streamnccl.bench.ddp: {dist.get_world_size()} rank(s), --steps {args.steps}"
              f" --rounds {args.rounds} --width {args.width} --batch-size {args.batch_size};"
              " medians of the rounds")  # fmt: skip
        for backend in (*BACKENDS, "ratio"):
            shown = ", ".join(f"{key} {value:.3f}" for key, value in result[backend].items())
            print(f"ddp {backend}: {shown}")
        print(f"max_param_difference {result['max_param_difference']}")
        write_results(args, result)
        sys.stdout.flush()
    trainers.clear()
    destroy_groups(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
