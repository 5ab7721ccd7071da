"""Tests of the test harness itself: results, failures, hangs and crashes on rank processes."""

import os
import time

import pytest
import torch
import torch.distributed as dist


def _identify(ctx):
    return ctx.rank, ctx.world_size, os.getpid()


def _all_reduce_sum(ctx, numel):
    # Closed form: rank r holds arange(numel) + r, so the sum is ws * arange + ws(ws-1)/2.
    tensor = torch.arange(numel, dtype=torch.float64) + ctx.rank
    dist.all_reduce(tensor)
    ws = ctx.world_size
    expected = ws * torch.arange(numel, dtype=torch.float64) + ws * (ws - 1) / 2
    torch.testing.assert_close(tensor, expected, rtol=0, atol=0)

    # The pattern for testing another backend: same random data through the gloo reference.
    data = torch.randn(numel, generator=ctx.seed(0))
    reference = data.clone()
    dist.all_reduce(data)
    dist.all_reduce(reference, group=ctx.gloo)
    torch.testing.assert_close(data, reference)
    return tensor.sum().item()


def _raise_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom from the test function")
    return "fine"


def _sleep_forever_on_rank_1(ctx):
    while ctx.rank == 1:
        time.sleep(1)


def _exit_abruptly_on_rank_1(ctx):
    if ctx.rank == 1:
        os._exit(3)  # stands in for a segfault in the extension


def _seeds(ctx):
    return ctx.seed(0).initial_seed(), ctx.seed(1).initial_seed()


@pytest.mark.parametrize("world_size", [2, 3])
def test_results_come_back_in_rank_order_from_persistent_ranks(rank_pools, world_size):
    first = rank_pools(world_size).run(_identify)
    assert [(rank, ws) for rank, ws, _ in first] == [(r, world_size) for r in range(world_size)]
    assert len({pid for _, _, pid in first}) == world_size
    assert rank_pools(world_size).run(_identify) == first  # same processes serve again


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduce_matches_closed_form_and_gloo_reference(rank_pools, world_size):
    numel, ws = 1000, world_size
    expected_total = ws * numel * (numel - 1) / 2 + numel * ws * (ws - 1) / 2
    assert rank_pools(ws).run(_all_reduce_sum, numel) == [expected_total] * ws


def test_seeds_differ_per_rank_and_index(rank_pools):
    seeds = [seed for pair in rank_pools(2).run(_seeds) for seed in pair]
    assert len(set(seeds)) == 4


def test_remote_exception_names_rank_and_traceback_and_pool_survives(rank_pools):
    before = rank_pools(2).run(_identify)
    with pytest.raises(AssertionError) as failure:
        rank_pools(2).run(_raise_on_rank_1)
    message = str(failure.value)
    assert "rank 1 failed in _raise_on_rank_1" in message
    assert "Traceback" in message and "ValueError: boom from the test function" in message
    assert "rank 0" not in message
    assert rank_pools(2).run(_identify) == before  # same processes, no restart


@pytest.mark.slow
def test_hang_fails_within_timeout_and_next_run_gets_fresh_pool(rank_pools):
    before = rank_pools(2).run(_identify)
    started = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        rank_pools(2).run(_sleep_forever_on_rank_1, timeout=3)
    assert time.monotonic() - started < 8
    assert "ranks [1] did not answer within 3 s: probable hang in _sleep_forever_on_rank_1" in str(
        failure.value
    )
    after = rank_pools(2).run(_identify)
    assert {pid for _, _, pid in after}.isdisjoint(pid for _, _, pid in before)
    for _, _, pid in before:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped, not orphaned


def test_crashed_rank_is_reported_at_once(rank_pools):
    # Restarting after this kill works as after a hang (tested above), so it is not redone.
    started = time.monotonic()
    with pytest.raises(
        AssertionError,
        match="rank 1 failed in _exit_abruptly_on_rank_1:\nprocess exited with code 3",
    ):
        rank_pools(2).run(_exit_abruptly_on_rank_1)
    assert time.monotonic() - started < 5  # noticed by its exit, not by the timeout


def test_close_stops_ranks_cleanly(rank_pools):
    # Runs last: the fixture's own close() at module end then has nothing left to do.
    pids = [pid for _, _, pid in rank_pools(3).run(_identify)]
    assert rank_pools(3).close() == [0, 0, 0]  # exited by themselves, not killed
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
