"""monitored_barrier: rank 0 names the ranks that did not reach it, as gloo's does, and the others
learn at once that it failed. torch 2.14+ sends dist.monitored_barrier to any group with a CPU
backend (older releases refuse every backend but gloo in Python): the group's own
monitored_barrier reaches streamnccl on every release. Each test uses a group of its own: a
rank that skips a barrier is a barrier behind the others on that group, as on gloo."""

import time
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist

pytestmark = pytest.mark.torch_internals  # c10d's monitored_barrier reaching streamnccl's

WORLD_SIZES = [2, 3]


def _fresh_group(ctx):
    return dist.new_group(backend="streamnccl", timeout=timedelta(seconds=30))


def _every_rank_arrives(ctx, wait_all_ranks):
    group = _fresh_group(ctx)
    time.sleep(0.2 * ctx.rank)  # arriving apart
    for _ in range(2):
        group.monitored_barrier(timedelta(seconds=20), wait_all_ranks=wait_all_ranks)
    total = torch.ones(2)
    dist.all_reduce(total, group=group)
    dist.destroy_process_group(group)
    return total.tolist()


@pytest.mark.parametrize("wait_all_ranks", [False, True])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_rank_passes_when_all_arrive(rank_pools, world_size, wait_all_ranks):
    results = rank_pools(world_size).run(_every_rank_arrives, wait_all_ranks)
    assert results == [[float(world_size)] * 2] * world_size


def _some_ranks_stay_away(ctx, absent, wait_all_ranks):
    group = _fresh_group(ctx)
    timeout = timedelta(seconds=1)
    started = time.monotonic()
    if ctx.rank in absent:
        outcome = "absent"
    else:
        with pytest.raises(dist.DistBackendError) as failure:
            group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        outcome = str(failure.value)
    took = time.monotonic() - started
    dist.barrier(group=ctx.gloo)  # the absent ranks wait for the others' failures
    total = torch.ones(2)
    dist.all_reduce(total, group=group)  # the group is fine
    dist.destroy_process_group(group)
    return outcome, took, total.tolist()


def test_rank_0_names_the_first_rank_that_did_not_arrive_and_the_others_learn_at_once(
    rank_pools,
):
    results = rank_pools(3).run(_some_ranks_stay_away, absent=[1], wait_all_ranks=False)
    (zero, _, total0), (absent, _, _), (two, took_two, _) = results
    assert absent == "absent"
    assert (
        "[streamnccl rank 0/3" in zero
        and "Rank 1 failed to pass monitoredBarrier in 1000 ms" in zero
    )
    assert (
        "Rank 2 successfully reached monitoredBarrier, but received errors while waiting for "
        "send/recv from rank 0: " in two
    ), two
    assert "Rank 1 failed to pass monitoredBarrier" in two, two  # rank 0's verdict, at once
    assert took_two < 10, "rank 2 waited out a timeout instead of hearing from rank 0"
    assert total0 == [3.0, 3.0]


@pytest.mark.slow
def test_with_wait_all_ranks_rank_0_names_every_rank_that_did_not_arrive(rank_pools):
    results = rank_pools(3).run(_some_ranks_stay_away, absent=[1, 2], wait_all_ranks=True)
    zero = results[0][0]
    assert "Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms" in zero, zero


def _rank_0_without_time(ctx):
    group = _fresh_group(ctx)
    if ctx.rank == 0:
        with pytest.raises(dist.DistBackendError, match="Rank 0 timed out in monitoredBarrier"):
            group.monitored_barrier(timedelta(seconds=0))
    dist.destroy_process_group(group)


def test_rank_0_that_has_no_time_left_says_so(rank_pools):
    rank_pools(2).run(_rank_0_without_time)


def _torchs_own_call(ctx):
    group = _fresh_group(ctx)
    dist.monitored_barrier(group, timeout=timedelta(seconds=20), wait_all_ranks=True)
    dist.destroy_process_group(group)
    return True


def test_torchs_monitored_barrier_reaches_streamnccl_where_torch_allows_it(rank_pools):
    if torch.torch_version.TorchVersion(torch.__version__) < "2.14":
        pytest.skip("torch before 2.14 refuses monitored_barrier in Python for all but gloo")
    assert rank_pools(2).run(_torchs_own_call) == [True, True]


def _one_rank_broken(ctx, broken):
    group = _fresh_group(ctx)
    if ctx.rank == broken:
        # This rank's group is broken: it must not wait, and must say so.
        group._get_backend(torch.device("cpu")).abort()
    started = time.monotonic()
    with pytest.raises(dist.DistBackendError) as failure:
        group.monitored_barrier(timedelta(seconds=30))
    took = time.monotonic() - started
    dist.destroy_process_group(group)
    return str(failure.value), took


def test_a_broken_rank_0_fails_every_rank_at_once(rank_pools):
    (zero, _), (one, took_one) = rank_pools(2).run(_one_rank_broken, broken=0)
    assert "aborted by the caller" in zero, zero
    assert "received errors while waiting for send/recv from rank 0: " in one, one
    assert "aborted by the caller" in one, one  # rank 0's reason
    assert took_one < 20, "rank 1 waited out the timeout instead of hearing from rank 0"


def _keys_left(ctx):
    store = dist.PrefixStore("monitored_keys/", dist.distributed_c10d._get_default_store())
    gloo = ctx.gloo._get_backend(torch.device("cpu"))
    group = streamnccl.ProcessGroup(
        store, ctx.rank, ctx.world_size, timedelta(seconds=30), streamnccl.Options(), gloo=gloo
    )
    group.monitored_barrier(timedelta(seconds=20))
    dist.barrier(group=ctx.gloo)  # every rank has left it
    prefix = "streamnccl/monitored_barrier/0/"
    keys = [f"{prefix}arrived/{r}" for r in range(1, ctx.world_size)]
    keys += [f"{prefix}release", f"{prefix}departed"]
    left = [key for key in keys if store.check([key])]
    group.shutdown()
    return left


def test_a_barrier_every_rank_passed_leaves_no_keys_behind(rank_pools):
    # A group of the same name, made later over the same store, counts its barriers from 0
    # again: a key left behind would let its ranks pass without rank 0.
    assert rank_pools(3).run(_keys_left) == [[]] * 3


def test_rank_0_names_a_rank_whose_group_broke_at_once(rank_pools):
    (zero, took_zero), (one, _) = rank_pools(2).run(_one_rank_broken, broken=1)
    assert "aborted by the caller" in one, one
    assert "Rank 1 failed to pass monitoredBarrier: " in zero and "aborted by the caller" in zero
    assert took_zero < 20, "rank 0 waited out the timeout for a rank that had said it could not"
