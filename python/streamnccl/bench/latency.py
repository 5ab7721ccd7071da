"""`python -m streamnccl.bench.latency [--ops N] [--bytes B] [--rounds R]`: the cost of one op's
hand-offs between threads, streamnccl against gloo in one run.

Four measures, each taken in `--rounds` rounds in which the two backends run back to back (the
machine's drift falls on both); a round's ratio is streamnccl's time over gloo's, and the
report gives each backend's median time, the median ratio and the ratios' range:

- `sync`: a sync all_reduce of `--bytes`, `--ops` times in a loop (every rank; alone it is
  one rank): the fixed cost of an op;
- `async`: an async all_reduce of `--bytes` issued and waited, one at a time, `--ops` times:
  where the op's thread hand-offs show;
- `future`: as `async`, but waited on through the op's future (`get_future().wait()`), as
  DDP's reducer waits for its buckets;
- `inflight`: `--ops` async all_reduce issued at once, each on a tensor of its own, then
  waited: the time to issue them (the first figure) and to have them all done;
- `pingpong` (ranks 0 and 1 of two or more): `--ops` round trips of a `--bytes` `dist.send`
  and `dist.recv`, with the CPU time per round trip of rank 0's calling thread and the
  context switches per round trip (voluntary and not, from /proc) of that thread, of its whole
  process, and of its threads by name. With `--pad-us P`, a third contender in its rounds,
  `gloo+pad`: gloo with P µs of busy CPU before each op on both ranks, which shows how the
  round trip grows with the calling thread's own cost of an op.

Rank 0 prints one line per measure and backend, then the ratio; with --json writes them.
"""

import functools
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import streamnccl  # noqa: F401  (registers the backend "streamnccl")

from .cli import destroy_groups, init_default_group, paired_arguments, write_results

BACKENDS = ("streamnccl", "gloo")


def switches(status_file: str) -> int:
    with open(status_file) as status:
        return sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)


def switches_by_thread_name() -> dict:
    """Context switches so far of each of the process's threads, summed by thread name (the
    name each library gives its threads: streamnccl-host, a lane's worker, Gloo's, ...)."""
    counts = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                name = comm.read().strip()
            counts[name] = counts.get(name, 0) + switches(f"/proc/self/task/{task}/status")
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return counts


def sync_ops(group, tensor, ops: int) -> dict:
    start = time.perf_counter()
    for _ in range(ops):
        dist.all_reduce(tensor, group=group)
    return {"us_per_op": (time.perf_counter() - start) / ops * 1e6}


def in_flight(group, tensor, ops: int) -> dict:
    tensors = [tensor.clone() for _ in range(ops)]
    start = time.perf_counter()
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    issued = time.perf_counter()
    for work in works:
        work.wait()
    return {"issue_us_per_op": (issued - start) / ops * 1e6,
            "all_done_us_per_op": (time.perf_counter() - start) / ops * 1e6}  # fmt: skip


def async_ops(group, tensor, ops: int) -> dict:
    start = time.perf_counter()
    for _ in range(ops):
        dist.all_reduce(tensor, group=group, async_op=True).wait()
    return {"us_per_op": (time.perf_counter() - start) / ops * 1e6}


def busy(us: float) -> None:
    """Keeps the calling thread on the CPU for `us` µs."""
    until = time.perf_counter() + us * 1e-6
    while time.perf_counter() < until:
        pass


def future_ops(group, tensor, ops: int) -> dict:
    start = time.perf_counter()
    for _ in range(ops):
        dist.all_reduce(tensor, group=group, async_op=True).get_future().wait()
    return {"us_per_op": (time.perf_counter() - start) / ops * 1e6}


def ping_pong(group, tensor, ops: int, pad_us: float = 0.0) -> dict:
    rank = dist.get_rank(group)
    if rank > 1:
        return {}
    peer = dist.get_global_rank(group, 1 - rank)
    first, then = (dist.send, dist.recv) if rank == 0 else (dist.recv, dist.send)
    thread_before, process_before = switches("/proc/thread-self/status"), switches_by_thread_name()
    cpu_before = time.thread_time()
    start = time.perf_counter()
    for _ in range(ops):
        if pad_us:
            busy(pad_us)
        first(tensor, peer, group=group)
        if pad_us:
            busy(pad_us)
        then(tensor, peer, group=group)
    seconds = time.perf_counter() - start
    cpu_seconds = time.thread_time() - cpu_before
    thread_after, process_after = switches("/proc/thread-self/status"), switches_by_thread_name()
    by_name = {name: (count - process_before.get(name, 0)) / ops
               for name, count in process_after.items()}  # fmt: skip
    result = {"us_per_round_trip": seconds / ops * 1e6,
              "thread_cpu_us": cpu_seconds / ops * 1e6,
              "thread_switches": (thread_after - thread_before) / ops,
              "process_switches": sum(by_name.values())}  # fmt: skip
    # Per thread name, where a thread switched at least once in ten round trips.
    result.update({f"switches[{name}]": n for name, n in sorted(by_name.items()) if n >= 0.1})
    return result


def measure(name, groups, tensor, ops, rounds, control, pad_us=0.0) -> dict:
    run = {"sync": sync_ops, "async": async_ops, "future": future_ops, "inflight": in_flight,
           "pingpong": ping_pong}[name]  # fmt: skip
    contenders = {backend: lambda n, group=group: run(group, tensor, n)
                  for backend, group in groups.items()}  # fmt: skip
    if name == "pingpong" and pad_us:
        contenders["gloo+pad"] = lambda n: ping_pong(groups["gloo"], tensor, n, pad_us)
    for contender in contenders.values():  # warm-up: connections, lanes, the recorder's entries
        contender(min(ops, 200))
    timed = {who: functools.partial(contender, ops) for who, contender in contenders.items()}
    return paired(timed, rounds, control)


def ratios(samples: dict, over: str, under: str, key: str) -> dict:
    """The median and range over rounds of `over`'s `key` / `under`'s, round by round."""
    pairs = zip(samples[over], samples[under], strict=True)
    values = [new[key] / old[key] for new, old in pairs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired(contenders: dict, rounds, control) -> dict:
    """Each of `contenders` (name: a run of the measure) in turn, `rounds` times, the ranks
    lined up on `control` before each; returns each one's medians (of every key its runs'
    results hold; the first is the time) and the ratio of streamnccl's time to gloo's: its
    median and range (and gloo+pad's to gloo's, where it ran)."""
    samples = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            dist.barrier(group=control)
            samples[name].append(run())
    if not samples["gloo"][0]:
        return {}
    time_key = next(iter(samples["gloo"][0]))
    result = {
        name: {key: statistics.median(s.get(key, 0.0) for s in runs) for key in runs[0]}
        for name, runs in samples.items()
    }
    result["ratio"] = ratios(samples, "streamnccl", "gloo", time_key)
    if "gloo+pad" in samples:
        result["pad_ratio"] = ratios(samples, "gloo+pad", "gloo", time_key)
    return result


def main(argv=None) -> int:
    parser = paired_arguments(__spec__.name, __doc__, ops=2000, bytes=4096)
    parser.add_argument(
        "--pad-us",
        type=float,
        default=0.0,
        metavar="P",
        help="pingpong: also gloo with P µs of busy CPU before each op",
    )
    args = parser.parse_args(argv)
    if args.pad_us < 0:
        parser.error(f"--pad-us must be 0 or more, not {args.pad_us}")
    control = init_default_group()
    groups = {backend: dist.new_group(backend=backend) for backend in BACKENDS}
    tensor = torch.ones(max(args.bytes // 4, 1))
    names = ["sync", "async", "future", "inflight"]
    if dist.get_world_size() > 1:
        names.append("pingpong")
    results = {
        name: measure(name, groups, tensor, args.ops, args.rounds, control, args.pad_us)
        for name in names
    }
    if dist.get_rank() == 0:
        print(f"# streamnccl.bench.latency: {dist.get_world_size()} rank(s), --ops {args.ops}"
              f" --bytes {args.bytes} --rounds {args.rounds}"
              + (f" --pad-us {args.pad_us}" if args.pad_us else "")
              + "; medians of the rounds")  # fmt: skip
        for name, result in results.items():
            for backend, values in result.items():
                shown = ", ".join(f"{key} {value:.2f}" for key, value in values.items())
                print(f"{name} {backend}: {shown}")
        write_results(args, results)
        sys.stdout.flush()
    destroy_groups(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
