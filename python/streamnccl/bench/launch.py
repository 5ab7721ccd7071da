"""`python -m streamnccl.bench.launch [--ops N] [--rounds R] [--json FILE]`: what launching one op
costs the host.

One process, no GPU needed. Each op is an all_reduce of one float followed by its ``wait()``:

- sync: on the caller's stream (``asyncOp`` false), as ``dist.all_reduce(t)`` issues it;
- async: on the internal stream, with an event each way, and ``wait()`` joining the caller's
  stream (``dist.all_reduce(t, async_op=True).wait()``).

The backends, in one run, rounds interleaved (in two phases: see measure()):

- torch's own no-op ``fake`` backend, which hands back a completed Work at once: the floor,
  what torch's bindings and a Work cost any backend;
- streamnccl's NCCL path over CUDA and NCCL calls that do nothing (csrc/fake/NoOpDevice.hpp):
  streamnccl's own launch path, the core, the Work and its future, the events, the flight
  recorder and the watchdog's hand-off, without any device's cost. It runs twice, as shipped
  (a flight recorder of 2,000 entries) and without the recorder (``trace_buffer_size=0``), so
  the recorder's part shows as the difference;
- the same path over the fake GPU (csrc/fake/: CUDA and NCCL as the tests model them, call
  recording off), for reference: what the fake's checks and data movement add. They stand in
  for the host cost of CUDA's and NCCL's own calls, which the built-in ``nccl`` pays too.

Each figure is the median over rounds of the time per op.
"""

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions, FakeProcessGroup

try:
    from streamnccl import _testing
except ImportError as missing:
    raise ImportError(
        "streamnccl.bench.launch runs over the test doubles, streamnccl._testing, which this "
        "build lacks: build them with `bash scripts/setup.sh --testing` (or "
        "STREAMNCCL_BUILD_TESTING=1 pip install --no-build-isolation -e .)"
    ) from missing

CPU = torch.device("cpu")  # the fake group's "cuda" tensors
MODES = ("sync", "async")


def allreduce_options(async_op: bool) -> AllreduceOptions:
    options = AllreduceOptions()
    options.asyncOp = async_op
    return options


def torch_fake():
    """torch's no-op backend: the floor."""
    return FakeProcessGroup._create_internal(0, 1, FakeProcessGroup.Options()), None


def streamnccl_no_op_device(trace_buffer_size: int):
    """streamnccl's NCCL path over CUDA and NCCL calls that do nothing, connected."""
    group = _testing.no_op_device_process_group(
        dist.HashStore(), timedelta(seconds=60), trace_buffer_size=trace_buffer_size
    )
    group.eager_connect_single_device(CPU)
    return group, None


def streamnccl_fake_gpu(trace_buffer_size: int):
    """streamnccl's NCCL path over the fake GPU, connected, its calls not recorded."""
    group, gpu = _testing.recording_process_group(
        dist.HashStore(),
        0,
        1,
        timedelta(seconds=60),
        trace_buffer_size=trace_buffer_size,
        models={"progress": False},
    )
    group.eager_connect_single_device(CPU)
    gpu.record_calls(False)
    return group, gpu


def time_ops(group, gpu, async_op: bool, ops: int) -> float:
    """Microseconds per launch-and-wait of `ops` all_reduce of one float."""
    tensor = torch.ones(1)
    options = allreduce_options(async_op)
    start = time.perf_counter()
    for _ in range(ops):
        group.allreduce([tensor], options).wait()
    seconds = time.perf_counter() - start
    if gpu is not None:  # the fake GPU runs what was launched before the next block starts
        if not gpu.synchronize():
            raise RuntimeError("the fake GPU did not finish the benchmark's ops")
    return seconds / ops * 1e6


def measure_side_by_side(backends: dict, ops: int, rounds: int) -> dict:
    """{mode: {backend: median microseconds per op}}, the backends' rounds interleaved."""
    samples = {(name, mode): [] for name in backends for mode in MODES}
    for group, gpu in backends.values():  # warm-up: first-op set-up, caches
        for mode in MODES:
            time_ops(group, gpu, mode == "async", min(ops, 1000))
    for _ in range(rounds):
        for name, (group, gpu) in backends.items():
            for mode in MODES:
                samples[(name, mode)].append(time_ops(group, gpu, mode == "async", ops))
    for group, _ in backends.values():
        group.shutdown()
    return {
        mode: {name: statistics.median(samples[(name, mode)]) for name in backends}
        for mode in MODES
    }


def measure(ops: int, rounds: int) -> dict:
    """Two phases, each against its own floor: the flight recorder is one per process, and
    once a group has asked for one every group records (see trace_buffer_size), so streamnccl
    without it is measured first."""
    bare = measure_side_by_side(
        {"torch fake": torch_fake(),
         "streamnccl, no flight recorder": streamnccl_no_op_device(trace_buffer_size=0)},
        ops, rounds,
    )  # fmt: skip
    shipped = measure_side_by_side(
        {"torch fake": torch_fake(),
         "streamnccl": streamnccl_no_op_device(trace_buffer_size=2000),
         "streamnccl over the fake GPU": streamnccl_fake_gpu(trace_buffer_size=2000)},
        ops, rounds,
    )  # fmt: skip
    return {mode: {"without recorder": bare[mode], "shipped": shipped[mode]} for mode in MODES}


def report(results: dict) -> list:
    """One row per mode: the floor, streamnccl above it, the flight recorder's part (each
    phase against its own floor), and what the fake GPU's modelling adds."""
    rows = []
    for mode, phases in results.items():
        shipped = phases["shipped"]
        floor = shipped["torch fake"]
        streamnccl = shipped["streamnccl"]
        bare = phases["without recorder"]
        rest = bare["streamnccl, no flight recorder"] - bare["torch fake"]
        fake_gpu = shipped["streamnccl over the fake GPU"]
        rows.append({
            "mode": mode,
            "torch_fake_us": floor,
            "streamnccl_us": streamnccl,
            "above_floor_us": streamnccl - floor,
            "flight_recorder_us": streamnccl - floor - rest,
            "rest_us": rest,
            "fake_gpu_us": fake_gpu,
            "fake_gpu_adds_us": fake_gpu - streamnccl,
        })  # fmt: skip
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamnccl.bench.launch", description=__doc__)
    parser.add_argument("--ops", type=int, default=20000, help="ops per backend and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.ops < 1 or args.rounds < 1:
        parser.error("--ops and --rounds must be at least 1")
    if not hasattr(_testing, "recording_process_group"):
        print("streamnccl.bench.launch: this build has no NCCL path to measure", file=sys.stderr)
        return 2
    rows = report(measure(args.ops, args.rounds))
    print(f"# launch and wait of one all_reduce (1 float), 1 rank, median of {args.rounds} "
          f"rounds of {args.ops} ops; microseconds per op")  # fmt: skip
    print(
        "# streamnccl: over no-op CUDA and NCCL; above = streamnccl - torch fake = recorder "
        "+ rest; fake GPU: over the fake GPU, which adds its own modelling"
    )
    print(f"# {'mode':<6} {'torch fake':>11} {'streamnccl':>11} {'above':>9} "
          f"{'recorder':>9} {'rest':>9} {'fake GPU':>9} {'adds':>9}")  # fmt: skip
    for row in rows:
        print(f"  {row['mode']:<6} {row['torch_fake_us']:>11.2f} {row['streamnccl_us']:>11.2f} "
              f"{row['above_floor_us']:>9.2f} {row['flight_recorder_us']:>9.2f} "
              f"{row['rest_us']:>9.2f} {row['fake_gpu_us']:>9.2f} "
              f"{row['fake_gpu_adds_us']:>9.2f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
