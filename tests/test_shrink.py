"""torch.distributed.shrink_group on the host path: the survivors of a group go on in a smaller
one, whether a rank died (examples/shrink_on_failure.py, which gloo cannot run) or is merely
left out; bad input gets torch's errors and leaves the group as it was.
"""

import re
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist
from test_examples import torchrun

pytestmark = pytest.mark.torch_internals  # torch's shrink_group around streamnccl's

TIMEOUT = timedelta(seconds=20)


@pytest.mark.slow
def test_survivors_of_a_dead_rank_shrink_and_finish_training_alike(tmp_path):
    # At torch's default timeout (30 minutes): every survivor learns of the death from the
    # group (a closed connection, or the break posted by a rank that saw one), and each error
    # names the dead rank, which answered no roll call.
    done = torchrun("shrink_on_failure.py", 4, timeout_s=180, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for rank in range(3):
        failed = re.search(
            rf"rank {rank}: step 4 failed ([0-9.]+) s after the death: DistBackendError: (.*)",
            done.stdout,
        )
        assert failed, output
        # "rank 3 did not answer", or "ranks 1, 3" where a live rank's watcher ran late.
        assert re.search(r"ranks? [0-9, ]*\b3 did not answer the group's roll call", failed[2])
        # Printed, and reported in docs/errors.md; bounded here only far below any timeout.
        assert float(failed[1]) < 30, output
        assert f"rank {rank}: now rank {rank} of 3" in output, output
        assert re.search(rf"rank {rank}: first step of the shrunk group done [0-9.]+ s", output)
    assert "3 ranks finished 10 steps: parameters identical" in done.stdout, output


@pytest.mark.slow
def test_gloo_cannot_shrink_and_says_so(tmp_path):
    done = torchrun("shrink_on_failure.py", 4, "--backend", "gloo", timeout_s=180, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "TypeError: Process group backend" in output and "does not support shrinking" in output


def _bad_input(ctx):
    group = dist.new_group(backend="streamnccl", timeout=TIMEOUT)
    size = ctx.world_size
    for bad in ([], [size], [-1], [1, 1], list(range(size))):
        with pytest.raises(ValueError):
            dist.shrink_group(bad, group=group)
        # The backend checks the same when called directly, where torch checks nothing.
        with pytest.raises(ValueError, match="streamnccl shrink"):
            group._get_backend(torch.device("cpu")).shrink(bad)
    with pytest.raises(RuntimeError, match="is in the exclusion list"):
        dist.shrink_group([ctx.rank], group=group)
    with pytest.raises(ValueError, match="this rank"):
        group._get_backend(torch.device("cpu")).shrink([ctx.rank])
    total = torch.ones(3)
    dist.all_reduce(total, group=group)  # untouched: every rank still in it
    dist.destroy_process_group(group)
    return total.tolist()


def test_bad_input_gets_torchs_errors_and_changes_nothing(rank_pools):
    assert rank_pools(3).run(_bad_input) == [[3.0] * 3] * 3


def _shrink_a_subgroup(ctx, flags):
    group = dist.new_group(backend="streamnccl", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(1), group=group)
    if ctx.rank == 1:  # left out, alive: it takes no part
        dist.destroy_process_group(group)
        # torch 2.14+ counts the shrunk group, which it names by a hash, in the survivors' count
        # of groups (_process_group_name): the next group made without a name would be named
        # differently here, and never meet. Counted here too, as the survivors count it, for
        # the pool's next test (a user's program that goes on making groups must do the same).
        dist.distributed_c10d._process_group_name([0, 2], use_hashed_name=True)
        return None
    pending = None
    if ctx.rank == 0:
        pending = dist.irecv(torch.zeros(2), src=1, group=group)  # rank 1 never sends
    options = streamnccl.Options(enable_timing=True)
    small = dist.shrink_group([1], group=group, shrink_flags=flags, pg_options=options)
    total = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(total, group=small)
    backend = small._get_backend(torch.device("cpu"))
    seen = {
        "rank": small.rank(),
        "size": small.size(),
        "total": total.tolist(),
        "backend": dist.get_backend(small),
        "timing": backend.streamnccl_options.enable_timing,
        "global ranks": dist.get_process_group_ranks(small),
    }
    if pending is not None and flags == dist.distributed_c10d.SHRINK_ABORT:
        with pytest.raises(dist.DistBackendError, match="shrunk with SHRINK_ABORT"):
            pending.wait()
        seen["pending"] = "aborted"
    dist.destroy_process_group(small)
    return seen


@pytest.mark.parametrize("flags", ["SHRINK_DEFAULT", "SHRINK_ABORT"])
def test_a_subgroup_shrinks_around_a_rank_left_out(rank_pools, flags):
    flag = getattr(dist.distributed_c10d, flags)
    results = rank_pools(3).run(_shrink_a_subgroup, flag)
    assert results[1] is None
    for new_rank, seen in enumerate(results[0::2]):
        assert seen["rank"] == new_rank and seen["size"] == 2
        assert seen["total"] == [4.0, 4.0]  # 1 + 3: rank 1's share is gone
        assert seen["backend"] == "streamnccl" and seen["timing"] is True
        assert seen["global ranks"] == [0, 2]
    assert results[0].get("pending") == ("aborted" if flags == "SHRINK_ABORT" else None)
