"""streamnccl.bench: sizes, nccl-tests' bandwidth accounting, the result checks, the report,
and short runs under torchrun on CPU."""

import argparse
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import streamnccl
import torch
import torch.distributed as dist
from streamnccl import _testing
from streamnccl.bench import cli, report
from streamnccl.bench.check import count_wrong
from streamnccl.bench.cli import UsageError, parse_args, parse_size, settle, sweep_sizes
from streamnccl.bench.collectives import COLLECTIVES
from streamnccl.bench.sweep import Result, bandwidths, rounds

K, M, G = 1 << 10, 1 << 20, 1 << 30

# --- sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [("1", 1), ("4096", 4096), ("1K", K), ("4k", 4 * K), ("4M", 4 * M), ("1G", G),
     ("16MB", 16 * M), ("2KiB", 2 * K), (" 8M ", 8 * M)],
)  # fmt: skip
def test_size_parsing_takes_binary_suffixes_and_plain_bytes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "1.5K", "-1", "0", "1T", "4 K B", "0x10"])
def test_size_parsing_refuses_what_is_not_a_size_and_says_what_it_wants(text):
    with pytest.raises(argparse.ArgumentTypeError, match="K, M or G|at least 1 byte"):
        parse_size(text)


def test_sweep_multiplies_from_min_up_to_max_included():
    assert sweep_sizes(K, 4 * M, 4) == [K, 4 * K, 16 * K, 64 * K, 256 * K, M, 4 * M]
    assert sweep_sizes(1000, 5000, 2) == [1000, 2000, 4000]  # never past -e
    assert sweep_sizes(8 * M, 8 * M, 2) == [8 * M]


def test_timed_iterations_split_into_rounds_as_even_as_can_be():
    assert rounds(20, 1) == [20]
    assert rounds(20, 4) == [5, 5, 5, 5]
    assert rounds(10, 4) == [3, 3, 2, 2]
    assert rounds(2, 5) == [1, 1]  # never an empty round


@pytest.mark.parametrize("minimum, maximum, factor", [(4 * K, K, 2), (K, M, 1), (K, M, 0)])
def test_sweep_refuses_an_empty_or_endless_range(minimum, maximum, factor):
    with pytest.raises(UsageError):
        sweep_sizes(minimum, maximum, factor)


def test_arguments_default_to_every_op_and_take_nccl_tests_names():
    args = parse_args(["-b", "1K", "-e", "16K", "-f", "2", "-d", "half"])
    assert args.ops == list(COLLECTIVES)
    assert args.sizes == [K, 2 * K, 4 * K, 8 * K, 16 * K]
    assert (args.dtype, args.redop, args.iters, args.async_op) == ("float16", "sum", 20, False)
    picked = parse_args(["--op", "reduce,all_reduce", "--op", "reduce", "--op", "send_recv"])
    assert picked.ops == ["reduce", "all_reduce", "send_recv"]
    with pytest.raises(SystemExit):
        parse_args(["--op", "allreduce"])
    with pytest.raises(SystemExit):
        parse_args(["-b", "1M", "-e", "1K"])


def test_plot_without_matplotlib_is_refused_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit):
        parse_args(["--plot", "r.png"])
    assert "matplotlib" in capsys.readouterr().err


def test_settle_picks_the_baseline_of_the_device_and_refuses_what_cannot_run():
    assert settle(parse_args([]), "cpu").baseline == "gloo"
    assert settle(parse_args([]), "cuda").baseline == "nccl"
    with pytest.raises(UsageError, match="gloo has no AVG"):
        settle(parse_args(["--redop", "avg"]), "cpu")
    assert settle(parse_args(["--redop", "avg", "--baseline", "none"]), "cpu").redop == "avg"
    # avg does not matter to ops that do not reduce
    assert settle(parse_args(["--redop", "avg", "--op", "broadcast"]), "cpu")
    with pytest.raises(UsageError, match="integers"):
        settle(parse_args(["--redop", "avg", "-d", "int32", "--baseline", "none"]), "cpu")
    with pytest.raises(UsageError, match="cuda"):
        settle(parse_args(["--baseline", "nccl"]), "cpu")


# --- nccl-tests' accounting --------------------------------------------------------------

# doc/PERFORMANCE.md of NVIDIA/nccl-tests: busbw = algbw * factor(n).
NCCL_TESTS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("op", list(NCCL_TESTS_FACTORS))
def test_bus_bandwidth_factor_is_nccl_tests(op, world_size):
    assert COLLECTIVES[op].bus_factor(world_size) == pytest.approx(
        NCCL_TESTS_FACTORS[op](world_size), abs=1e-12
    )


def test_bandwidths_are_bytes_over_time_in_gigabytes_then_the_factor():
    # 8 ranks: all_reduce of 1 GB in 10 ms is 100 GB/s algbw and 175 GB/s busbw.
    algbw, busbw = bandwidths(10**9, 10_000.0, COLLECTIVES["all_reduce"].bus_factor(8))
    assert algbw == pytest.approx(100.0)
    assert busbw == pytest.approx(175.0)
    assert bandwidths(4096, 1.0, 1.0) == pytest.approx((4.096, 4.096))


def test_sizes_round_down_to_whole_elements_and_equal_chunks_as_nccl_tests():
    assert COLLECTIVES["all_reduce"].count(1000, 4, 3) == 250
    assert COLLECTIVES["all_gather"].count(1000, 4, 3) == 249  # 83 per rank
    assert COLLECTIVES["reduce_scatter"].count(1000, 4, 4) == 248
    assert COLLECTIVES["all_to_all"].count(4, 4, 3) == 3  # at least one element per rank
    assert COLLECTIVES["broadcast"].count(2, 4, 2) == 1


# --- --check -----------------------------------------------------------------------------

REDUCTIONS = {
    dist.ReduceOp.SUM: lambda s: s.sum(0),
    dist.ReduceOp.PRODUCT: lambda s: s.prod(0),
    dist.ReduceOp.MIN: lambda s: s.amin(0),
    dist.ReduceOp.MAX: lambda s: s.amax(0),
    dist.ReduceOp.AVG: lambda s: s.mean(0),
}


def by_hand(op, inputs, rank, redop):
    """What `op` gives `rank`, computed here from every rank's input, apart from the bench."""
    n = len(inputs)
    stacked = torch.stack([x.double() for x in inputs])
    if op == "all_reduce":
        return REDUCTIONS[redop](stacked)
    if op == "reduce":
        return REDUCTIONS[redop](stacked) if rank == 0 else None
    if op == "reduce_scatter":
        return REDUCTIONS[redop](stacked).chunk(n)[rank]
    if op == "all_gather":
        return torch.cat(inputs).double()
    if op == "broadcast":
        return inputs[0].double()
    if op == "all_to_all":
        return torch.cat([x.chunk(n)[rank] for x in inputs]).double()
    if op == "send_recv":
        return inputs[(rank - 1) % n].double()
    raise AssertionError(op)


# Integer AVG is left out: the bench refuses it (see cli.settle).
CHECKED_CASES = [
    pytest.param(redop, dtype, id=f"{str(redop).split('.')[-1]}-{str(dtype).split('.')[-1]}")
    for redop in REDUCTIONS
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64)
    if dtype.is_floating_point or redop != dist.ReduceOp.AVG
]


@pytest.mark.parametrize("redop, dtype", CHECKED_CASES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_expected_results_match_each_op_done_by_hand_and_one_wrong_element_is_counted(
    world_size, redop, dtype
):
    for name, collective in COLLECTIVES.items():
        if world_size < collective.min_world_size:
            continue
        count = collective.count(600, dtype.itemsize, world_size)
        inputs = [
            collective.buffers(count, r, world_size, dtype, "cpu", redop).input
            for r in range(world_size)
        ]
        for rank in range(world_size):
            want = by_hand(name, inputs, rank, redop)
            expected = collective.expected(count, rank, world_size, redop, "cpu")
            if want is None:
                assert expected is None, name
                continue
            result = want.to(dtype)  # a backend's exact answer, in its dtype
            assert count_wrong(result, expected) == 0, (name, rank)
            result.view(-1)[rank] += 1  # one element off by one
            assert count_wrong(result, expected) == 1, (name, rank)
            result.view(-1)[-1] = float("nan") if dtype.is_floating_point else -7
            assert count_wrong(result, expected) == 2, (name, rank)


def test_inputs_tell_ranks_and_positions_apart():
    collective = COLLECTIVES["all_gather"]
    inputs = [collective.buffers(26, r, 2, torch.float32, "cpu", dist.ReduceOp.SUM).input
              for r in range(2)]  # fmt: skip
    assert not torch.equal(inputs[0], inputs[1])
    assert len(set(inputs[0].tolist())) > 1
    # The chunks of two ranks swapped is wrong everywhere.
    expected = collective.expected(26, 0, 2, dist.ReduceOp.SUM, "cpu")
    assert count_wrong(torch.cat(inputs[::-1]), expected) == 26


# --- report ------------------------------------------------------------------------------


def result(backend, time_us, nbytes=4 * K, wrong=0):
    algbw, busbw = bandwidths(nbytes, time_us, 1.0)
    return Result(backend, "all_reduce", nbytes, nbytes // 4, "float32", "sum", -1, time_us,
                  time_us, algbw, busbw, wrong, [time_us])  # fmt: skip


def test_table_puts_the_backends_side_by_side_with_the_time_ratio():
    args = parse_args(["--op", "all_reduce"])
    results = [result("streamnccl", 10.0), result("gloo", 20.0),
               result("streamnccl", 300.0, M, None), result("gloo", 200.0, M, None)]  # fmt: skip
    text = report.table(results, ["streamnccl", "gloo"], world_size=2,
                        device=torch.device("cpu"), args=args)  # fmt: skip
    header = next(line for line in text.splitlines() if "streamnccl" in line and "gloo" in line)
    assert header.index("streamnccl") < header.index("gloo")
    rows = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert rows[0][:5] == ["4096", "1024", "float32", "sum", "-1"]
    assert rows[0][5:] == ["10.00", "0.410", "0.410", "0", "20.00", "0.205", "0.205", "0", "0.500"]
    assert rows[1][6] == "3.50"  # two decimals from 1 GB/s up, three digits below
    assert rows[1][8] == "N/A" and rows[1][-1] == "1.500"
    assert "# all_reduce time ratio: 0.500 at 4096 B (smallest), 1.500 at 1048576 B" in text


def test_ratio_is_the_median_of_the_ratios_within_rounds():
    # A burst of noise in one round (the third) moves the means, not the paired median.
    ours = result("streamnccl", 1.0)
    ours.round_times_us = [110.0, 210.0, 900.0]
    theirs = result("gloo", 1.0)
    theirs.round_times_us = [100.0, 200.0, 100.0]
    assert report.ratio({"streamnccl": ours, "gloo": theirs}, "gloo") == pytest.approx(1.1)


def test_json_has_the_documented_keys(tmp_path):
    args = parse_args(["--op", "all_reduce", "--json", str(tmp_path / "r.json")])
    settle(args, "cpu")
    meta = report.meta(args, ["streamnccl", "gloo"], 2, torch.device("cpu"))
    report.write_json(args.json, meta, [result("streamnccl", 10.0)], ["a note"])
    document = json.loads(Path(args.json).read_text())
    assert {"versions", "world_size", "device", "args"} <= set(document["meta"])
    assert document["meta"]["versions"]["torch"] == torch.__version__
    assert document["meta"]["args"]["sizes"] == args.sizes
    (row,) = document["results"]
    assert {"backend", "op", "bytes", "count", "dtype", "time_us", "algbw_gbps", "busbw_gbps",
            "wrong"} <= set(row)  # fmt: skip
    assert document["notes"] == ["a note"]


# --- runs --------------------------------------------------------------------------------


def run_bench(*args, nproc, timeout_s, cwd, module="streamnccl.bench"):
    """python -m streamnccl.bench under torchrun (or alone with nproc=None); a hang fails
    the test after `timeout_s` with what it printed."""
    launcher = [sys.executable]
    if nproc:
        launcher += ["-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                     "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]  # fmt: skip
    # The streamnccl these tests import (this checkout's, built in place, or an installed one).
    package_dir = str(Path(streamnccl.__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [package_dir, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    command = [*launcher, "-m", module, *args]
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd
        )
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"{' '.join(command)} did not finish within {timeout_s} s:\n"
                    f"{timeout.stdout}\n{timeout.stderr}")  # fmt: skip


def table_rows(stdout):
    return [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]


def test_two_rank_cpu_run_prints_both_backends_and_writes_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra (scripts/setup.sh)")
    done = run_bench("--op", "all_reduce", "-b", "1K", "-e", "4M", "-f", "4",
                     "--baseline", "gloo", "--json", "r.json", "--plot", "r.png", "-c",
                     nproc=2, timeout_s=120, cwd=tmp_path)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "streamnccl vs gloo, 2 ranks, cpu" in done.stdout, output
    rows = table_rows(done.stdout)
    sizes = [K, 4 * K, 16 * K, 64 * K, 256 * K, M, 4 * M]
    assert [int(row[0]) for row in rows] == sizes, output
    for row in rows:  # size count type redop root | time algbw busbw #wrong (x2) | ratio
        assert len(row) == 14, row
        assert row[2:5] == ["float32", "sum", "-1"]
        assert row[8] == row[12] == "0"  # checked, nothing wrong
        assert float(row[7]) > 0 and float(row[11]) > 0
        assert float(row[13]) == pytest.approx(float(row[5]) / float(row[9]), rel=0.01)

    document = json.loads((tmp_path / "r.json").read_text())
    meta = document["meta"]
    assert (meta["world_size"], meta["device"], meta["backends"]) == (
        2,
        "cpu",
        ["streamnccl", "gloo"],
    )
    assert meta["args"]["iters"] == 20 and meta["args"]["sizes"] == sizes
    results = document["results"]
    assert sorted((r["backend"], r["bytes"]) for r in results) == sorted(
        (b, s) for b in ("streamnccl", "gloo") for s in sizes
    )
    for r in results:
        assert r["op"] == "all_reduce" and r["dtype"] == "float32" and r["wrong"] == 0
        assert r["count"] == r["bytes"] // 4
        assert r["time_us"] > 0
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # 2(n-1)/n at n = 2
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_every_op_gives_right_results_on_both_backends(tmp_path):
    done = run_bench("-b", "1K", "-e", "64K", "-f", "64", "-n", "2", "-w", "1", "--rounds", "2",
                     "-c", "--json", "r.json", nproc=2, timeout_s=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 iters in 2 rounds after 1 warm-up" in done.stdout
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    for r in results:
        assert len(r["round_times_us"]) == 2
        assert r["time_us"] == pytest.approx(sum(r["round_times_us"]) / 2)
    measured = {(r["op"], r["backend"], r["bytes"]): r["wrong"] for r in results}
    assert measured == {
        (op, backend, nbytes): 0
        for op in COLLECTIVES
        for backend in ("streamnccl", "gloo")
        for nbytes in (K, 64 * K)
    }
    for op in COLLECTIVES:
        assert f"# {op} time ratio:" in done.stdout


@pytest.mark.slow
def test_check_catches_a_wrong_result_and_exits_non_zero(tmp_path):
    # The hidden test hook makes rank 0 see one element of every streamnccl result off by one.
    done = run_bench("--op", "all_gather,reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0",
                     "-c", "--test-corrupt-result", "--json", "r.json",
                     nproc=2, timeout_s=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "python -m streamnccl.bench: 2 wrong elements" in done.stderr
    wrong = {(r["op"], r["backend"]): r["wrong"]
             for r in json.loads((tmp_path / "r.json").read_text())["results"]}  # fmt: skip
    assert wrong == {("all_gather", "streamnccl"): 1, ("all_gather", "gloo"): 0,
                     ("reduce", "streamnccl"): 1, ("reduce", "gloo"): 0}  # fmt: skip
    assert [row[8] for row in table_rows(done.stdout)] == ["1", "1"]


def test_one_rank_without_torchrun_runs_and_says_what_it_skipped(tmp_path):
    done = run_bench("--op", "broadcast,send_recv", "-b", "4K", "-e", "4K", "-n", "2", "-w",
                     "1", "-c", nproc=None, timeout_s=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "streamnccl vs gloo, 1 rank, cpu" in done.stdout
    assert "# send_recv skipped: it needs at least 2 ranks" in done.stdout
    (row,) = table_rows(done.stdout)
    assert row[:5] == ["4096", "1024", "float32", "none", "0"] and row[8] == row[12] == "0"


def test_arguments_no_backend_can_run_exit_2_with_the_reason(tmp_path):
    done = run_bench("--op", "all_reduce", "--redop", "avg", nproc=None, timeout_s=120,
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gloo has no AVG reduction" in done.stderr


@pytest.mark.slow
def test_scale_mode_reports_every_measure_for_both_backends(tmp_path):
    report_file = tmp_path / "scale.json"
    done = run_bench("--ops", "300", "--inflight", "50", "--groups", "3", "--json",
                     str(report_file), nproc=2, timeout_s=180, cwd=tmp_path,
                     module="streamnccl.bench.scale")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(report_file.read_text())
    assert document["world_size"] == 2
    for backend in ("streamnccl", "gloo"):
        measures = document["results"][backend]
        loop = measures["loop"]
        assert loop["us_per_op"] > 0 and len(loop["rss_mib"]) == 11
        assert all(mib > 0 for mib in loop["rss_mib"])
        flight = measures["in_flight"]
        assert flight["wrong"] == 0 and 0 < flight["issue_ms"] <= flight["all_done_ms"]
        groups = measures["subgroups"]
        assert groups["make_ms"] > 0 and groups["threads_per_group"] >= 1
        assert f"{backend} subgroups: make_ms" in done.stdout


def test_latency_mode_refuses_a_negative_pad_before_anything_runs(capsys):
    from streamnccl.bench import latency

    with pytest.raises(SystemExit):
        latency.main(["--pad-us", "-1"])
    assert "--pad-us must be 0 or more" in capsys.readouterr().err
    assert not dist.is_initialized()


@pytest.mark.slow
def test_latency_mode_reports_each_measure_for_both_backends(tmp_path):
    report_file = tmp_path / "latency.json"
    pad_us = 1000.0
    done = run_bench("--ops", "50", "--rounds", "2", "--pad-us", str(pad_us), "--json",
                     str(report_file), nproc=2, timeout_s=180, cwd=tmp_path,
                     module="streamnccl.bench.latency")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(report_file.read_text())
    assert document["world_size"] == 2
    results = document["results"]
    for backend in ("streamnccl", "gloo"):
        assert results["sync"][backend]["us_per_op"] > 0
        assert results["async"][backend]["us_per_op"] > 0
        assert results["future"][backend]["us_per_op"] > 0
        flight = results["inflight"][backend]
        assert 0 < flight["issue_us_per_op"] <= flight["all_done_us_per_op"]
        pingpong = results["pingpong"][backend]
        assert pingpong["us_per_round_trip"] > 0
        assert 0 < pingpong["thread_cpu_us"]
        # Every round trip blocks the calling thread at least once, whatever the backend.
        assert pingpong["thread_switches"] >= 1 and pingpong["process_switches"] >= 1
    # The padded gloo spends at least its two pads of a round trip on each rank.
    padded = results["pingpong"]["gloo+pad"]
    assert padded["us_per_round_trip"] >= 2 * pad_us
    assert padded["us_per_round_trip"] > results["pingpong"]["gloo"]["us_per_round_trip"]
    for name in ("sync", "async", "future", "inflight", "pingpong"):
        ratio = results[name]["ratio"]
        assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]
    assert results["pingpong"]["pad_ratio"]["min"] > 1
    assert "pad_ratio" not in results["sync"]
    assert "pingpong streamnccl: us_per_round_trip" in done.stdout


@pytest.mark.slow
def test_ddp_mode_trains_the_same_model_on_both_backends_and_times_its_steps(tmp_path):
    report_file = tmp_path / "ddp.json"
    done = run_bench("--steps", "5", "--rounds", "2", "--width", "16", "--json", str(report_file),
                     nproc=2, timeout_s=180, cwd=tmp_path,
                     module="streamnccl.bench.ddp")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(report_file.read_text())
    assert document["world_size"] == 2
    results = document["results"]
    for backend in ("streamnccl", "gloo"):
        assert results[backend]["ms_per_step"] > 0
    ratio = results["ratio"]
    assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]
    # The same weights, batches and steps on each: DDP's averaged gradients, and so the
    # parameters, are the same bit for bit whichever backend all-reduced them.
    assert results["max_param_difference"] == 0.0
    assert "ddp streamnccl: ms_per_step" in done.stdout


@pytest.mark.torch_internals
@pytest.mark.skipif(
    not hasattr(_testing, "recording_process_group"),
    reason="this build has no NCCL path (STREAMNCCL_BUILD_NCCL=0 or a CPU-only torch)",
)
def test_launch_mode_reports_the_floor_and_streamnccl_above_it(tmp_path):
    report_file = tmp_path / "launch.json"
    done = run_bench("--ops", "300", "--rounds", "2", "--json", str(report_file), nproc=None,
                     timeout_s=120, cwd=tmp_path, module="streamnccl.bench.launch")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(report_file.read_text())["rows"]
    assert [row["mode"] for row in rows] == ["sync", "async"]
    for row in rows:
        assert row["torch_fake_us"] > 0 and row["streamnccl_us"] > 0 and row["fake_gpu_us"] > 0
        assert row["above_floor_us"] == pytest.approx(row["streamnccl_us"] - row["torch_fake_us"])
        parts = row["flight_recorder_us"] + row["rest_us"]
        assert parts == pytest.approx(row["above_floor_us"])
        assert row["fake_gpu_adds_us"] == pytest.approx(row["fake_gpu_us"] - row["streamnccl_us"])
    assert len(table_rows(done.stdout)) == 2, done.stdout


@pytest.mark.skipif(
    not hasattr(_testing, "no_op_device_process_group"),
    reason="this build has no NCCL path (STREAMNCCL_BUILD_NCCL=0 or a CPU-only torch)",
)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_the_no_op_device_runs_the_nccl_path_and_leaves_the_tensor_alone(async_op):
    # The launch bench's streamnccl figure is only the launch path if its ops really go the
    # whole way: issued, tracked, retired, counted. (The no-op NCCL moves no data.)
    group = _testing.no_op_device_process_group(dist.HashStore(), timedelta(seconds=30),
                                           trace_buffer_size=0)  # fmt: skip
    try:
        tensor = torch.full((4,), 3.0)
        options = dist.AllreduceOptions()
        options.asyncOp = async_op
        for _ in range(3):
            work = group.allreduce([tensor], options)
            assert work.wait(timedelta(seconds=10))
            assert work.is_completed() and work.is_success()
        assert torch.equal(tensor, torch.full((4,), 3.0))
        stats = group._stats()["all_reduce"]
        assert (stats["count"], stats["failures"], stats["in_flight"]) == (3, 0, 0)
    finally:
        group.shutdown()
