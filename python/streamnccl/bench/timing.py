"""The timed loop: line the ranks up, time `iters` ops back to back.

Times are host wall-clock, as nccl-tests takes them: the loop issues every op, then waits for
the device. On CUDA the time to the end of issuing, over the number of ops, is the host launch
overhead per op (a launch path that blocked the host would show up there as op time). Each
rank's mean is reduced over ranks with MAX, since a collective is done when its slowest rank
is (nccl-tests averages over ranks by default, its -a 1).
"""

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Timing:
    time_us: float  # per op, from the first launch to the device being done with the last
    launch_us: float  # per op, host time to issue it (on CPU ops run as they are issued)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(collective, buffers, group, redop, async_op: bool) -> None:
    # wait() on a CUDA Work only makes the current stream wait: the host goes on.
    for work in collective.launch(buffers, group, redop, async_op):
        work.wait()


def warm_up(collective, buffers, group, redop, async_op: bool, iters: int, device) -> None:
    for _ in range(iters):
        run_once(collective, buffers, group, redop, async_op)
    synchronize(device)


def measure(collective, buffers, group, redop, async_op, *, iters, device, control) -> Timing:
    """Times `iters` runs of `collective` on `group`; `control` (a gloo group) lines the
    ranks up and takes the MAX over ranks, so neither backend under test does bookkeeping."""
    dist.barrier(group=control)
    start = time.perf_counter()
    for _ in range(iters):
        run_once(collective, buffers, group, redop, async_op)
    issued = time.perf_counter()
    synchronize(device)
    end = time.perf_counter()
    per_op = torch.tensor([end - start, issued - start], dtype=torch.float64) / iters
    dist.all_reduce(per_op, op=dist.ReduceOp.MAX, group=control)
    return Timing(time_us=per_op[0].item() * 1e6, launch_us=per_op[1].item() * 1e6)
