"""What users' tools see of streamnccl: the flight recorder in torch's format (read by torch's
own analyzer), torch.profiler's record_param_comms ranges, per-op timing, and group stats."""

import json
import os
import pickle
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import streamnccl
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

pytestmark = (
    pytest.mark.torch_internals
)  # torch's flight recorder analyzer and profiler read streamnccl's

TESTS = Path(__file__).resolve().parent
WORLD_SIZES = [2, 3]


def run_with_timeout(command, timeout_s, **kwargs):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"{command} did not finish within {timeout_s} s:\n{timeout.stdout}")


# --- the flight recorder, read by torch's analyzer


@pytest.mark.slow
def test_torchs_analyzer_names_the_mismatched_collective(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    job = run_with_timeout(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=3",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0",
            str(TESTS / "jobs" / "collective_mismatch.py"),
        ],  # fmt: skip
        timeout_s=120,
        env=dict(os.environ, STREAMNCCL_DUMP_DIR=str(dumps), OMP_NUM_THREADS="1"),
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert sorted(os.listdir(dumps)) == [f"streamnccl_trace_rank_{r}" for r in range(3)]

    # torch 2.11's analyzer, unmodified, on the folder as the ranks left it.
    analysis = run_with_timeout(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps)],
        timeout_s=60,
    )
    report = analysis.stdout + analysis.stderr
    assert analysis.returncode == 0, report
    assert "collective: nccl:broadcast" in report, report
    assert "Culprit rank 0; Error type: COLLECTIVE_TYPE_MISMATCH" in report, report
    assert "Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH" in report, report
    assert (
        "Expected collective type: 'broadcast' does not match found collective type: 'all_reduce'"
        in report
    ), report


def _recorded_ops(ctx):
    # A subgroup of the last two ranks: the dump names it with its members' global ranks.
    members = list(range(ctx.world_size))[-2:]
    group = dist.new_group(members, backend="streamnccl")
    if ctx.rank not in members:
        return None
    me = members.index(ctx.rank)
    x = torch.ones(3, 2)
    dist.all_reduce(x, group=group)
    gathered = torch.empty(6, 2, dtype=torch.float64)
    dist.all_gather_into_tensor(gathered, torch.ones(3, 2, dtype=torch.float64), group=group)
    if me == 0:
        dist.send(torch.ones(5), dst=members[1], group=group)
    else:
        dist.recv(torch.empty(5), src=members[0], group=group)
    recorder = streamnccl.flight_recorder()
    dist.destroy_process_group(group)

    config = recorder["pg_config"][group.group_name]
    assert config["ranks"] == str(members), config
    entries = [e for e in recorder["entries"] if e["process_group"][0] == group.group_name]
    assert [e["record_id"] for e in entries] == sorted(e["record_id"] for e in entries)
    peer = 1 - me
    p2p_name = f"nccl:send {me}->{peer}" if me == 0 else f"nccl:recv {me}<-{peer}"
    summary = [
        (e["profiling_name"], e["collective_seq_id"], e["p2p_seq_id"], e["op_id"], e["is_p2p"])
        for e in entries
    ]
    assert summary == [
        ("nccl:all_reduce", 1, 0, 1, False),
        ("nccl:_all_gather_base", 2, 0, 2, False),
        (p2p_name, 2, 1, 3, True),
    ], summary
    assert entries[0]["input_sizes"] == [[3, 2]] and entries[0]["output_sizes"] == [[3, 2]]
    assert entries[1]["input_sizes"] == [[3, 2]] and entries[1]["output_sizes"] == [[6, 2]]
    assert entries[1]["input_dtypes"] == ["Double"] and entries[1]["output_dtypes"] == ["Double"]
    for entry in entries:
        assert entry["state"] == "completed" and entry["retired"], entry
        assert entry["time_created_ns"] <= entry["time_discovered_started_ns"]
        assert entry["time_discovered_started_ns"] <= entry["time_discovered_completed_ns"]
        assert entry["timeout_ms"] > 0 and "error" not in entry
    assert recorder["version"] == "2.10"
    assert recorder["pg_status"][group.group_name]["last_completed_collective"] == 2
    return True


def test_the_dump_on_demand_names_each_op_as_torchs_recorder_does(rank_pools):
    assert rank_pools(3).run(_recorded_ops)[-2:] == [True, True]


def test_dump_flight_recorder_writes_what_it_returns(tmp_path):
    path = tmp_path / "trace"
    dump = streamnccl.dump_flight_recorder(path)
    assert path.read_bytes() == dump
    assert set(pickle.loads(dump)) >= {"version", "pg_config", "pg_status", "entries"}


# --- torch.profiler


def _profiled_ops(ctx, trace_path):
    x = torch.ones(1000)
    gathered = torch.empty(1000 * ctx.world_size)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, x)
    if ctx.rank == 0:
        prof.export_chrome_trace(trace_path)
    return True


def test_a_profile_shows_each_op_once_with_its_comms_metadata(rank_pools, tmp_path):
    trace_path = str(tmp_path / "trace.json")
    rank_pools(2).run(_profiled_ops, trace_path)
    with open(trace_path) as file:
        events = [e for e in json.load(file)["traceEvents"] if e.get("ph") == "X"]
    comms = [e["args"] for e in events if e["name"] == "record_param_comms"]
    expected = [("allreduce", 1000, 1000), ("all_gather_into_tensor", 1000, 2000)]
    assert [(a["Collective name"], a["In msg nelems"], a["Out msg nelems"]) for a in comms] == (
        expected
    ), comms
    for args in comms:
        assert args["dtype"] == "Float" and args["Group size"] == 2, args
        assert args["Process Group Description"] == "default_pg", args
        assert args["Process Group Ranks"] == "[0, 1]", args
    # Gloo underneath the host path does not show as ops of its own.
    assert not [e["name"] for e in events if e["name"].startswith("gloo:")]


# --- timing


def _timed_ops(ctx):
    timed = dist.new_group(backend="streamnccl", pg_options=streamnccl.Options(enable_timing=True))
    untimed = dist.new_group(backend="streamnccl")
    work = dist.all_reduce(torch.ones(10_000), group=timed, async_op=True)
    work.wait()
    assert work._get_duration() > 0
    # A recv whose sender has not sent yet has no duration yet.
    if ctx.rank == 1:
        pending = dist.irecv(torch.empty(4), src=0, group=timed)
        with pytest.raises(ValueError, match="known once the op has completed"):
            pending._get_duration()
    dist.barrier(group=untimed)
    if ctx.rank == 0:
        dist.send(torch.ones(4), dst=1, group=timed)
    else:
        pending.wait()
        assert pending._get_duration() > 0
    work = dist.all_reduce(torch.ones(4), group=untimed, async_op=True)
    work.wait()
    with pytest.raises(ValueError, match="enable_timing=True"):
        work._get_duration()
    stats = streamnccl.stats(timed)["all_reduce"]
    assert stats["timed"] == 1 and stats["total_ms"] > 0
    assert stats["p50_ms"] == stats["p99_ms"] == stats["mean_ms"] == stats["total_ms"]
    assert "timed" not in streamnccl.stats(untimed)["all_reduce"]
    dist.destroy_process_group(timed)
    dist.destroy_process_group(untimed)
    return True


def test_timing_gives_each_op_a_duration(rank_pools):
    assert rank_pools(2).run(_timed_ops) == [True, True]


# --- group stats


def _counted_ops(ctx, timed):
    n = ctx.world_size
    group = dist.new_group(
        backend="streamnccl",
        pg_options=streamnccl.Options(enable_timing=timed),
        timeout=timedelta(seconds=60),
    )
    dist.all_reduce(torch.ones(1), group=group)  # before the reset: not counted
    streamnccl.reset_stats(group)
    for _ in range(5):
        dist.all_reduce(torch.ones(100), group=group)
    works = [dist.all_reduce(torch.ones(7, dtype=torch.float64), group=group, async_op=True)]
    for work in works:
        work.wait()
    gathered = torch.empty(25 * n, dtype=torch.int32)
    for _ in range(3):
        dist.all_gather_into_tensor(gathered, torch.ones(25, dtype=torch.int32), group=group)
    dist.broadcast(torch.ones(2, 2), src=0, group=group)
    stats = streamnccl.stats(group)
    dist.destroy_process_group(group)

    assert set(stats) == {"all_reduce", "_all_gather_base", "broadcast"}, stats
    reduce, gather, bcast = stats["all_reduce"], stats["_all_gather_base"], stats["broadcast"]
    assert (reduce["count"], reduce["bytes"]) == (6, 5 * 400 + 56)
    assert (gather["count"], gather["bytes"]) == (3, 3 * 25 * 4 * n)  # the larger: the output
    assert (bcast["count"], bcast["bytes"]) == (1, 16)
    for kind in stats.values():
        assert (kind["failures"], kind["in_flight"]) == (0, 0), kind
        if timed:
            assert kind["timed"] == kind["count"], kind
            assert 0 < kind["p50_ms"] <= kind["p99_ms"], kind
            assert kind["mean_ms"] == pytest.approx(kind["total_ms"] / kind["count"])
        else:
            assert "timed" not in kind
    return True


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_stats_count_the_ops_and_bytes_issued(rank_pools, world_size, timed):
    assert rank_pools(world_size).run(_counted_ops, timed) == [True] * world_size
