"""`python -m streamnccl.bench.scale [--ops N] [--inflight N] [--groups N]`: what grows.

streamnccl and gloo in the same run, each in groups of its own over every rank (run it under
torchrun for several ranks; alone it is one rank):

- `--ops` sync all_reduce of one element in a loop: the time per op, and the process's
  resident memory at every tenth of the loop (the flight recorder and the stats are bounded,
  so it must not grow);
- `--inflight` async all_reduce issued at once, each on a tensor of its own, then waited: the
  time to issue them, to finish them, and the memory they held;
- `--groups` subgroups over every rank, made, then one all_reduce on each, then destroyed: the
  time to make them and the threads of the process per group, before and after destroying.

Rank 0 prints one line per measure, `backend measure: values`, and with --json writes them.
"""

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist

import streamnccl  # noqa: F401  (registers the backend "streamnccl")

from .cli import init_default_group, write_results

BACKENDS = ("streamnccl", "gloo")


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def loop(group, ops: int) -> dict:
    tensor = torch.ones(1)
    for _ in range(min(ops, 1000)):  # warm-up: connections, the recorder's first entries
        dist.all_reduce(tensor, group=group)
    every = max(ops // 10, 1)
    samples = [resident_mib()]
    start = time.perf_counter()
    for done in range(1, ops + 1):
        dist.all_reduce(tensor, group=group)
        if done % every == 0:
            samples.append(resident_mib())
    seconds = time.perf_counter() - start
    return {"us_per_op": seconds / ops * 1e6, "rss_mib": samples,
            "growth_mib": samples[-1] - samples[0]}  # fmt: skip


def in_flight(group, count: int) -> dict:
    tensors = [torch.ones(1) for _ in range(count)]
    before = resident_mib()
    start = time.perf_counter()
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    issued = time.perf_counter() - start
    held = resident_mib() - before
    for work in works:
        work.wait()
    finished = time.perf_counter() - start
    wrong = sum(int(t.item() != dist.get_world_size(group)) for t in tensors)
    return {"issue_ms": issued * 1e3, "all_done_ms": finished * 1e3, "held_mib": held,
            "wrong": wrong}  # fmt: skip


def subgroups(backend: str, count: int) -> dict:
    before = threads()
    start = time.perf_counter()
    groups = [dist.new_group(backend=backend) for _ in range(count)]
    made = time.perf_counter() - start
    start = time.perf_counter()
    for group in groups:
        dist.all_reduce(torch.ones(1), group=group)
    ran = time.perf_counter() - start
    with_groups = threads()
    for group in groups:
        dist.destroy_process_group(group)
    del group, groups  # the last references: what a group's threads wait for
    gc.collect()
    return {"make_ms": made * 1e3, "one_op_each_ms": ran * 1e3,
            "threads_per_group": (with_groups - before) / count,
            "threads_left_after_destroy": threads() - before}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamnccl.bench.scale", description=__doc__)
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--inflight", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    init_default_group()
    rank = dist.get_rank()
    results = {}
    for backend in BACKENDS:
        group = dist.new_group(backend=backend)
        results[backend] = {
            "loop": loop(group, args.ops),
            "in_flight": in_flight(group, args.inflight),
        }
        dist.destroy_process_group(group)
        results[backend]["subgroups"] = subgroups(backend, args.groups)
    if rank == 0:
        print(f"# streamnccl.bench.scale: {dist.get_world_size()} rank(s), --ops {args.ops}"
              f" --inflight {args.inflight} --groups {args.groups}")  # fmt: skip
        for backend, measures in results.items():
            for measure, values in measures.items():
                shown = ", ".join(
                    f"{k} {[round(x, 1) for x in v] if isinstance(v, list) else round(v, 2)}"
                    for k, v in values.items()
                )
                print(f"{backend} {measure}: {shown}")
        write_results(args, results)
        sys.stdout.flush()
    dist.destroy_process_group()
    wrong = sum(m["in_flight"]["wrong"] for m in results.values())
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
