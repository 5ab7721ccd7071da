"""The sweep: every op at every size on streamnccl and the baseline, interleaved.

Both backends live in one process, each in a group of its own over every rank, made the same
way (`new_group(backend=...)`); the default group is a gloo group that only lines ranks up and
gathers numbers (`control`), so neither measured backend does the bookkeeping. At each size
the backends take turns: the timed iterations run in --rounds rounds (default 1), each round
timing every backend, the order reversed from round to round and the first backend
alternating from size to size, so noise on the machine falls on both and neither always
runs on a warmer cache.
"""

import os
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

from .check import count_wrong
from .cli import DTYPES, REDOPS, UsageError
from .collectives import COLLECTIVES
from .timing import measure, run_once, synchronize, warm_up

MEASURED = "streamnccl"


@dataclass
class Result:
    backend: str
    op: str
    bytes: int  # nccl-tests' size: see collectives
    count: int  # elements in those bytes
    dtype: str
    redop: str  # "none" for ops that do not reduce, as nccl-tests prints
    root: int  # -1 for ops without one
    time_us: float
    launch_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None when not checked
    round_times_us: list[float]  # time_us of each of the --rounds rounds: the noise

    def as_dict(self) -> dict:
        return asdict(self)


def bandwidths(nbytes: int, time_us: float, bus_factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10**9 bytes, as nccl-tests) of `nbytes` moved in `time_us`."""
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * bus_factor


def choose_device(requested: str | None, control) -> torch.device:
    """This rank's device: cuda (its LOCAL_RANK's GPU) when asked for or when every rank has
    a GPU, else cpu. Every rank must make the same choice, hence the MIN over ranks."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    has_gpu = torch.cuda.is_available() and local_rank < torch.cuda.device_count()
    everyone = torch.tensor([int(has_gpu)])
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN, group=control)
    if requested == "cuda" and not everyone.item():
        raise UsageError("--device cuda: not every rank has a GPU of its own")
    if requested == "cpu" or not everyone.item():
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def open_groups(baseline: str) -> dict:
    """backend name -> a group over every rank on that backend, streamnccl first."""
    groups = {MEASURED: dist.new_group(backend=MEASURED)}
    if baseline != "none":
        groups[baseline] = dist.new_group(backend=baseline)
    return groups


def _check(collective, buffers, group, redop, async_op, count, device, control, corrupt):
    """Runs the op once on fresh inputs; returns the wrong elements summed over ranks."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    run_once(collective, buffers, group, redop, async_op)
    synchronize(device)
    expected = collective.expected(count, rank, world_size, redop, device)
    wrong = 0
    if expected is not None:
        result = buffers.output
        if corrupt:  # the test hook of cli: one element off by one
            result = result.clone()
            result.view(-1)[0] += 1
        wrong = count_wrong(result, expected)
    total = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(total, group=control)
    return int(total.item())


def rounds(iters: int, count: int) -> list[int]:
    """`iters` timed iterations split into `count` rounds as even as can be (none empty)."""
    count = min(count, iters)
    return [iters // count + (1 if i < iters % count else 0) for i in range(count)]


def _one_size(args, collective, nbytes, groups, device, control, turn) -> list[Result]:
    """Both backends at one size: each checked and warmed up, then timed in rounds whose
    order alternates, starting with the backend `turn` picks."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dtype, redop = DTYPES[args.dtype], REDOPS[args.redop]
    count = collective.count(nbytes, dtype.itemsize, world_size)
    buffers, wrong = {}, {}
    for backend, group in groups.items():
        buffers[backend] = collective.buffers(count, rank, world_size, dtype, device, redop)
        wrong[backend] = None
        if args.check:
            corrupt = args.test_corrupt_result and backend == MEASURED and rank == 0
            wrong[backend] = _check(collective, buffers[backend], group, redop, args.async_op,
                                    count, device, control, corrupt)  # fmt: skip
        warm_up(collective, buffers[backend], group, redop, args.async_op, args.warmup_iters,
                device)  # fmt: skip
    order = list(groups)
    if turn % 2:
        order.reverse()
    time_us = dict.fromkeys(groups, 0.0)
    launch_us = dict.fromkeys(groups, 0.0)
    round_times_us = {backend: [] for backend in groups}
    for iters in rounds(args.iters, args.rounds):
        for backend in order:
            group = groups[backend]
            timing = measure(collective, buffers[backend], group, redop, args.async_op,
                             iters=iters, device=device, control=control)  # fmt: skip
            time_us[backend] += timing.time_us * iters / args.iters
            launch_us[backend] += timing.launch_us * iters / args.iters
            round_times_us[backend].append(timing.time_us)
        order.reverse()
    moved = count * dtype.itemsize
    results = []
    for backend in groups:
        algbw, busbw = bandwidths(moved, time_us[backend], collective.bus_factor(world_size))
        results.append(
            Result(
                backend=backend,
                op=collective.name,
                bytes=moved,
                count=count,
                dtype=args.dtype,
                redop=args.redop if collective.reduces else "none",
                root=collective.root,
                time_us=time_us[backend],
                launch_us=launch_us[backend],
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                wrong=wrong[backend],
                round_times_us=round_times_us[backend],
            )
        )
    return results


def run(args, groups: dict, device: torch.device, control) -> tuple[list[Result], list[str]]:
    """Every op at every size on every backend; returns the results and notes on what was
    skipped. Every rank returns the same results."""
    world_size = dist.get_world_size()
    collectives = [COLLECTIVES[name] for name in args.ops]
    notes = [
        f"{c.name} skipped: it needs at least {c.min_world_size} ranks"
        for c in collectives
        if world_size < c.min_world_size
    ]
    collectives = [c for c in collectives if world_size >= c.min_world_size]
    results = []
    steps = len(collectives) * len(args.sizes)
    # disable=None: a bar on a terminal only, not in logs.
    with tqdm(total=steps, disable=True if dist.get_rank() else None, unit="size") as bar:
        turn = 0
        for collective in collectives:
            for nbytes in args.sizes:
                bar.set_description(f"{collective.name} {nbytes} B")
                results += _one_size(args, collective, nbytes, groups, device, control, turn)
                turn += 1
                bar.update()
    return results, notes
