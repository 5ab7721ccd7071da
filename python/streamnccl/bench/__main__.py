"""`torchrun --nproc-per-node N -m streamnccl.bench [options]`; `--help` lists the options.

Without torchrun it runs as a single rank. Exits 1 when --check finds a wrong element and 2
on arguments that cannot work together.
"""

import sys

import torch.distributed as dist

import streamnccl  # noqa: F401  (registers the backend "streamnccl")

from . import report, sweep
from .cli import UsageError, init_default_group, parse_args, settle


def main(argv=None) -> int:
    args = parse_args(argv)
    control = init_default_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        device = sweep.choose_device(args.device, control)
        settle(args, device.type)
    except UsageError as error:  # every rank reaches the same verdict
        if rank == 0:
            print(f"python -m streamnccl.bench: error: {error}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    groups = sweep.open_groups(args.baseline)
    backends = list(groups)
    results, notes = sweep.run(args, groups, device, control)
    if rank == 0:
        print(report.table(results, backends, world_size=world_size, device=device, args=args))
        for note in notes:
            print(f"# {note}")
        if args.json:
            meta = report.meta(args, backends, world_size, device)
            report.write_json(args.json, meta, results, notes)
        if args.plot:
            from .plot import plot

            ranks = report.ranks(world_size)
            title = f"{' vs '.join(backends)}: {ranks}, {device.type}, {args.dtype}"
            plot(args.plot, results, backends, title)
        sys.stdout.flush()
    wrong = sum(r.wrong or 0 for r in results)
    dist.barrier(group=control)  # rank 0's files are written before anyone reports done
    dist.destroy_process_group()
    if wrong:
        if rank == 0:
            print(f"python -m streamnccl.bench: {wrong} wrong elements", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
