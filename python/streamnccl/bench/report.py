"""What rank 0 prints and writes: nccl-tests' table with the backends side by side, and JSON."""

import json
import platform
import socket
import statistics
import time
from collections import defaultdict

import torch

import streamnccl

TIME_MEANS = (
    "host wall-clock per op from the first launch to the device being done with the last, "
    "the mean over --iters ops on each rank, then the max over ranks"
)
RATIO_MEANS = (
    "streamnccl's time / the baseline's for the same op and size, taken in each round (the two"
    " run back to back) and the median over --rounds: 1.00 is parity, below 1 streamnccl is"
    " faster. Paired rounds, because on a shared machine the noise between rounds is larger"
    " than the difference between backends"
)


def ranks(world_size: int) -> str:
    return f"{world_size} rank{'' if world_size == 1 else 's'}"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def meta(args, backends: list[str], world_size: int, device: torch.device) -> dict:
    settings = {k: v for k, v in vars(args).items() if k != "test_corrupt_result"}
    return {
        "versions": streamnccl.info(),
        "nccl_of_torch": ".".join(map(str, torch.cuda.nccl.version()))
        if device.type == "cuda"
        else None,
        "world_size": world_size,
        "device": device.type,
        "device_name": _device_name(device),
        "host": socket.gethostname(),
        "backends": backends,
        "args": settings,
        "time_us": TIME_MEANS,
        "launch_us": "host time per op to issue it, before waiting for the device (CUDA)",
        "ratio": RATIO_MEANS,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_json(path: str, meta_: dict, results, notes: list[str]) -> None:
    document = {"meta": meta_, "results": [r.as_dict() for r in results], "notes": notes}
    with open(path, "w") as out:
        json.dump(document, out, indent=1)
        out.write("\n")


def ratio(results_of_row: dict, baseline: str) -> float | None:
    """streamnccl's time over the baseline's at one op and size: the median over rounds of
    the ratio within a round (with one round, the ratio of the times)."""
    if baseline not in results_of_row:
        return None
    ours = results_of_row["streamnccl"].round_times_us
    theirs = results_of_row[baseline].round_times_us
    return statistics.median(o / t for o, t in zip(ours, theirs, strict=True))


def _gbps(value: float) -> str:
    # nccl-tests' two decimals, but three digits below 1 GB/s: small messages on a host
    # path would all read 0.00.
    return f"{value:.2f}" if value >= 1 else f"{value:#.3g}"


class _Columns:
    """Fixed-width columns; the key columns, then one block per backend, then the ratio."""

    KEYS = [("size", "(B)", 12), ("count", "(elements)", 12), ("type", "", 9),
            ("redop", "", 6), ("root", "", 5)]  # fmt: skip

    def __init__(self, backends: list[str], with_launch: bool):
        self.backends = backends
        self.block = [("time", "(us)", 9), ("algbw", "(GB/s)", 8), ("busbw", "(GB/s)", 8)]
        if with_launch:
            self.block.append(("launch", "(us)", 8))
        self.block.append(("#wrong", "", 7))
        self.with_ratio = len(backends) > 1

    def header(self) -> list[str]:
        key_width = sum(w + 1 for _, _, w in self.KEYS)
        block_width = sum(w + 1 for _, _, w in self.block)
        titles = "#" + " " * (key_width - 1)
        titles += "".join(f"{name:>{block_width}}" for name in self.backends)
        lines = [titles.rstrip()]
        for row in (0, 1):
            cells = [f"{c[row]:>{c[2]}}" for c in self.KEYS]
            cells += [f"{c[row]:>{c[2]}}" for _ in self.backends for c in self.block]
            if self.with_ratio:
                cells.append(f"{('ratio', '(time)')[row]:>7}")
            line = " ".join(cells)
            lines.append(("#" + line[1:]).rstrip())
        return lines

    def row(self, by_backend: dict, baseline: str) -> str:
        first = next(iter(by_backend.values()))
        keys = [first.bytes, first.count, first.dtype, first.redop, first.root]
        cells = [f"{v:>{w}}" for v, (_, _, w) in zip(keys, self.KEYS, strict=True)]
        for name in self.backends:
            r = by_backend[name]
            values = [f"{r.time_us:.2f}", _gbps(r.algbw_gbps), _gbps(r.busbw_gbps)]
            if len(self.block) == 5:
                values.append(f"{r.launch_us:.2f}")
            values.append("N/A" if r.wrong is None else str(r.wrong))
            cells += [f"{v:>{w}}" for v, (_, _, w) in zip(values, self.block, strict=True)]
        if self.with_ratio:
            cells.append(f"{ratio(by_backend, baseline):>7.3f}")
        return " ".join(cells)


def table(results, backends: list[str], *, world_size, device, args) -> str:
    """The whole report: one nccl-tests table per op, the backends side by side."""
    baseline = backends[1] if len(backends) > 1 else None
    rows = defaultdict(dict)  # (op, bytes) -> backend -> Result, in the order of results
    for r in results:
        rows[(r.op, r.bytes)][r.backend] = r
    columns = _Columns(backends, with_launch=device.type == "cuda")
    mode = "async_op=True + wait()" if args.async_op else "sync"
    lines = [
        f"# streamnccl.bench: {' vs '.join(backends)}, {ranks(world_size)}, {device.type}"
        f" ({_device_name(device)}), {args.dtype}, {mode}, {args.iters} iters"
        f"{f' in {args.rounds} rounds' if args.rounds > 1 else ''} after {args.warmup_iters}"
        " warm-up",
        f"# time: {TIME_MEANS}",
    ]
    if baseline:
        lines.append(f"# ratio: {RATIO_MEANS}")
    for op in dict.fromkeys(r.op for r in results):
        lines += ["#", f"# {op}", *columns.header()]
        op_rows = [by for (name, _), by in rows.items() if name == op]
        lines += [columns.row(by, baseline) for by in op_rows]
        averages = ", ".join(
            f"{name} {_gbps(sum(by[name].busbw_gbps for by in op_rows) / len(op_rows))}"
            for name in backends
        )
        lines.append(f"# {op} avg busbw (GB/s): {averages}")
        if baseline:
            ends = [(op_rows[0], "smallest"), (op_rows[-1], "largest")][: len(op_rows)]
            lines.append(
                f"# {op} time ratio: "
                + ", ".join(
                    f"{ratio(by, baseline):.3f} at {by[baseline].bytes} B ({where})"
                    for by, where in ends
                )  # fmt: skip
            )
    return "\n".join(lines)
