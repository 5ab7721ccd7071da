"""Command-line arguments of the bench, named as in nccl-tests where it has the same knob."""

import argparse
import importlib.util
import json
import os
import re

import torch
import torch.distributed as dist

from .collectives import COLLECTIVES

# Units are binary, as in nccl-tests: -b 1K is 1024 bytes.
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"(\d+)([KMG]?)(?:i?B)?", re.IGNORECASE)

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
}
# nccl-tests' names for the same types (-d float, -d half, ...).
DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "int": "int32"}

REDOPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}

BASELINES = ("gloo", "nccl", "none")


class UsageError(ValueError):
    """Arguments that cannot work together, found once the device is known."""


def parse_size(text: str) -> int:
    """Bytes from '4096', '4K', '16M', '1G' (also '4KB', '4KiB'); binary units."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: expected a whole number of bytes with an optional K, M or G suffix"
            " (e.g. 512, 4K, 16M, 1G)"
        )
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r}: must be at least 1 byte")
    return size


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes*factor, ... up to max_bytes included, as nccl-tests' -b -e -f."""
    if min_bytes > max_bytes:
        raise UsageError(f"-b {min_bytes} is larger than -e {max_bytes}")
    if factor < 2:
        raise UsageError(f"-f {factor}: the factor between sizes must be at least 2")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def _op_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name != "all" and name not in COLLECTIVES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--op {text!r}: choose from all, {', '.join(COLLECTIVES)} (comma-separated or"
            " repeated)"
        )
    return names


def _dtype_name(text: str) -> str:
    name = DTYPE_ALIASES.get(text, text)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(
            f"--dtype {text!r}: choose from {', '.join([*DTYPES, *DTYPE_ALIASES])}"
        )
    return name


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m streamnccl.bench",
        description="nccl-tests style sweep of streamnccl and a baseline backend, side by side."
        " Run under torchrun: torchrun --nproc-per-node N -m streamnccl.bench ...",
    )
    add = parser.add_argument
    add("--op", type=_op_names, action="extend", dest="ops", metavar="OP[,OP...]",
        help=f"ops to measure (default: all): {', '.join(COLLECTIVES)}")  # fmt: skip
    add("-b", "--minbytes", type=parse_size, default=parse_size("1K"),
        help="smallest message, nccl-tests' size column (default 1K)")  # fmt: skip
    add("-e", "--maxbytes", type=parse_size, default=parse_size("16M"),
        help="largest message (default 16M)")  # fmt: skip
    add("-f", "--stepfactor", type=int, default=4, help="factor between sizes (default 4)")
    add("-n", "--iters", type=_positive, default=20, help="timed iterations (default 20)")
    add("-w", "--warmup-iters", type=_non_negative, default=5,
        help="untimed iterations before each timed loop (default 5)")  # fmt: skip
    add("--rounds", type=_positive, default=1,
        help="split the -n timed iterations into this many rounds, the backends taking turns"
        " between rounds: smooths out a noisy machine (default 1)")  # fmt: skip
    add("--dtype", "-d", type=_dtype_name, default="float32", help="element type (float32)")
    add("--redop", "-o", choices=list(REDOPS), default="sum", help="reduction (sum)")
    add("--async", dest="async_op", action="store_true",
        help="issue each op with async_op=True, then wait() on it (default: sync ops)")  # fmt: skip
    add("--device", choices=["cpu", "cuda"],
        help="cpu: host path; cuda: NCCL path (default: cuda if every rank has a GPU)")  # fmt: skip
    add("--baseline", choices=BASELINES,
        help="backend measured beside streamnccl (default: gloo on cpu, nccl on cuda)")  # fmt: skip
    add("-c", "--check", action="store_true",
        help="verify every result against its closed form; any wrong element exits 1")  # fmt: skip
    add("--json", metavar="FILE", help="write the results as JSON")
    add("--plot", metavar="FILE.png", help="plot busbw and time against size (needs matplotlib)")
    # Test hook, hidden from --help: rank 0 adds 1 to one element of every streamnccl result
    # before it is checked, so tests can see that --check catches a wrong result end to end.
    add("--test-corrupt-result", action="store_true", help=argparse.SUPPRESS)
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    ops = args.ops or ["all"]
    args.ops = list(COLLECTIVES) if "all" in ops else list(dict.fromkeys(ops))
    try:
        args.sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    except UsageError as error:
        parser.error(str(error))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib: pip install 'streamnccl[plot]' (or matplotlib)")
    return args


def settle(args: argparse.Namespace, device: str) -> argparse.Namespace:
    """Fills in what depends on the device and refuses combinations no backend can run."""
    args.device = device
    if args.baseline is None:
        args.baseline = "nccl" if device == "cuda" else "gloo"
    reducing = [name for name in args.ops if COLLECTIVES[name].reduces]
    if reducing and args.redop == "avg":
        if not DTYPES[args.dtype].is_floating_point:
            raise UsageError(f"--redop avg on {args.dtype}: the mean of integers is not one")
        if args.baseline == "gloo":
            # Emulating it (sum, then divide) would time a different op than streamnccl's.
            raise UsageError(
                "--redop avg: gloo has no AVG reduction; use --baseline none to measure"
                " streamnccl alone, or another --redop"
            )
    if args.baseline == "nccl" and device != "cuda":
        raise UsageError("--baseline nccl needs --device cuda (NCCL runs on GPUs only)")
    return args


def init_default_group():
    """The default group: gloo, over torchrun's ranks (its environment), or alone one rank.
    The benches line ranks up and gather numbers on it, so neither measured backend does."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD


def write_results(args: argparse.Namespace, results: dict) -> None:
    """With --json FILE, the run's world size, arguments and results, as every bench writes them."""
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"world_size": dist.get_world_size(), "args": vars(args),
                       "results": results}, out, indent=1)  # fmt: skip


def paired_arguments(module: str, doc: str, **counts: int) -> argparse.ArgumentParser:
    """The arguments of a bench that runs streamnccl and gloo in turns (`module`'s): each of
    `counts` as --name N with its default, then --rounds and --json."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    for name, default in counts.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", metavar="FILE")
    return parser


def destroy_groups(groups: dict) -> None:
    """Destroys the measured groups, then the default group (init_default_group's)."""
    for group in groups.values():
        dist.destroy_process_group(group)
    dist.destroy_process_group()
