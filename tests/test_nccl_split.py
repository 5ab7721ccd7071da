"""Subgroups split from their parent on the NCCL path, over the fake GPU: where the parent's
communicator is live on every rank, split_group and new_group make the subgroup's with
ncclCommSplit, every rank of the parent taking part (those outside the subgroup with
NCCL_SPLIT_NOCOLOR); otherwise the subgroup connects afresh at its first op, as before.
"""

import gc
from datetime import timedelta
from types import SimpleNamespace

import pytest
import streamnccl
import torch
import torch.distributed as dist
from fakes import (
    CPU,
    connect,
    fake_group,
    fake_ranks,
    needs_nccl_path,
    opts,
    run_ranks,
    shut_down,
)
from streamnccl import _C
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions

pytestmark = needs_nccl_path


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _C._FakeGpu.forget_thread_device()


def _all_reduce(pg, gpu, value, async_op=False):
    tensor = torch.full((4,), float(value))
    pg.allreduce([tensor], opts(AllreduceOptions, async_op)).wait()
    gpu.synchronize()
    return tensor


def _gather(pg, gpu, value):
    outputs = [torch.zeros(2) for _ in range(pg.size())]
    pg.allgather([outputs], [torch.full((2,), float(value))], opts(AllgatherOptions)).wait()
    gpu.synchronize()
    return [int(out[0]) for out in outputs]


def _subgroup_stores(parts):
    """A store per subgroup, as torch's split_group makes one per subgroup's name."""
    return {tuple(part): dist.HashStore() for part in parts}


def _split(parts, stores, take_part=None):
    """Every rank calls split with its own part (those in none, with the first), as torch's
    split_group does; a member gathers 10 + its parent rank in the subgroup."""

    def program(rank, pg, gpu):
        gpu.clear()
        mine = next((part for part in parts if rank in part), parts[0])
        if take_part is not None and rank not in mine:
            take_part(rank, pg)
            return None, None, gpu.calls()
        child = pg._split(stores[tuple(mine)], mine)
        if child is None:
            return None, None, gpu.calls()
        return child, _gather(child, gpu, 10 + rank), gpu.calls()

    return program


def _end(groups, results):
    shut_down(
        [(child, gpu) for (child, _, _), (_, gpu) in zip(results, groups, strict=True) if child]
    )
    shut_down(groups)
    for _, gpu in groups:
        assert gpu.violations() == []


def test_split_group_splits_the_parents_communicator_into_each_part():
    groups = connect(fake_ranks(4))
    parts = [[0, 1], [2, 3]]
    results = run_ranks(groups, _split(parts, _subgroup_stores(parts)))
    for rank, (child, gathered, calls) in enumerate(results):
        part = parts[rank // 2]
        assert (child.rank(), child.size()) == (rank % 2, 2)
        assert gathered == [10 + r for r in part]  # its own part's ranks, in order
        # The pinned sequence: a split of the parent (its part's lowest rank is the color),
        # not a fresh communicator, then the subgroup's collective on it.
        assert calls[0] == f"ncclCommSplit(C0, color={part[0]}, key={rank % 2}) -> C1", calls
        assert not [c for c in calls if c.startswith(("ncclGetUniqueId", "ncclCommInitRank"))]
        assert any(c.startswith("ncclAllGather") and "C1" in c for c in calls), calls
    _end(groups, results)


def test_ranks_outside_the_subgroup_take_part_in_its_split_and_the_parent_goes_on():
    groups = connect(fake_ranks(3))
    parts = [[0, 2]]
    results = run_ranks(groups, _split(parts, _subgroup_stores(parts)))
    assert [gathered for _, gathered, _ in results] == [[10, 12], None, [10, 12]]
    # Rank 1 is in no part: NCCL needs it in the split all the same, without a color.
    assert results[1][2] == ["ncclCommSplit(C0, color=NOCOLOR, key=0) -> none (this rank joins "
                             "no new communicator)"]  # fmt: skip
    # The parent is free again on every rank once the split is done.
    sums = run_ranks(groups, lambda rank, pg, gpu: _all_reduce(pg, gpu, rank + 1))
    assert [s.tolist() for s in sums] == [[6.0] * 4] * 3
    _end(groups, results)


def test_new_groups_ranks_outside_take_part_through_perform_nocolor_split():
    # What torch's new_group does with a bound default group: the creator of the subgroup
    # splits on its members (python/streamnccl), the others get perform_nocolor_split.
    groups = connect(fake_ranks(3))
    parts = [[1, 2]]
    results = run_ranks(
        groups,
        _split(
            parts, _subgroup_stores(parts), take_part=lambda r, pg: pg.perform_nocolor_split(CPU)
        ),
    )
    assert [gathered for _, gathered, _ in results] == [None, [11, 12], [11, 12]]
    assert results[0][2][0].startswith("ncclCommSplit(C0, color=NOCOLOR"), results[0][2]
    assert results[1][2][0] == "ncclCommSplit(C0, color=1, key=0) -> C1", results[1][2]
    _end(groups, results)


def test_a_parent_not_yet_connected_gives_a_subgroup_that_connects_afresh():
    groups = fake_ranks(3)  # no op yet: the parent has no communicator to split
    parts = [[0, 1]]
    results = run_ranks(groups, _split(parts, _subgroup_stores(parts)))
    for rank, (_, gathered, calls) in enumerate(results[:2]):
        assert gathered == [10, 11]
        assert not [c for c in calls if "ncclCommSplit" in c], calls
        assert f"ncclCommInitRank(nranks=2, rank={rank}, nonblocking) -> C0" in calls, calls
    assert results[2][2] == []  # rank 2 had nothing to take part in
    _end(groups, results)


def test_a_parent_broken_on_one_rank_gives_a_subgroup_that_connects_afresh():
    # Rank 0's parent broke (its communicator aborted), the others' not yet: had they called
    # ncclCommSplit, NCCL would wait for rank 0 forever. Every rank sees that, and none splits.
    groups = connect(fake_ranks(3))
    parts = [[0, 1]]
    split = _split(parts, _subgroup_stores(parts))

    def rank_zero_broke(rank, pg, gpu):
        if rank == 0:
            pg.abort()
        return split(rank, pg, gpu)

    results = run_ranks(groups, rank_zero_broke)
    for _, gathered, calls in results[:2]:
        assert gathered == [10, 11]
        assert not [c for c in calls if "ncclCommSplit" in c], calls
    assert results[2][2] == []
    shut_down(
        [(child, gpu) for (child, _, _), (_, gpu) in zip(results[:2], groups[:2], strict=True)]
    )
    for pg, _ in groups:  # broken, as a dead rank leaves it: its other ranks abort it too
        pg.abort()


def test_a_split_while_the_parent_has_ops_in_flight_leaves_them_to_finish():
    groups = connect(fake_ranks(3))
    parts = [[0, 1]]
    split = _split(parts, _subgroup_stores(parts))

    def split_with_an_op_in_flight(rank, pg, gpu):
        tensor = torch.full((4,), float(rank + 1))
        in_flight = pg.allreduce([tensor], opts(AllreduceOptions))
        result = split(rank, pg, gpu)
        in_flight.wait()
        gpu.synchronize()
        return result, tensor.tolist()

    outcomes = run_ranks(groups, split_with_an_op_in_flight)
    assert [tensor for _, tensor in outcomes] == [[6.0] * 4] * 3
    results = [result for result, _ in outcomes]
    assert [gathered for _, gathered, _ in results] == [[10, 11], [10, 11], None]
    assert results[2][2][0].startswith("ncclCommSplit(C0, color=NOCOLOR"), results[2][2]
    _end(groups, results)


def test_a_rank_that_never_takes_part_fails_the_split_within_the_timeout():
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=2)))
    parts = [[0, 1]]
    stores = _subgroup_stores(parts)

    def without_rank_two(rank, pg, gpu):
        # The first to give up tells the other, which then ends at once.
        expected = "not every rank that takes part|another member gave up"
        with pytest.raises(dist.DistBackendError, match=expected):
            pg._split(stores[(0, 1)], [0, 1])
        return gpu.calls()

    for calls in run_ranks(groups[:2], without_rank_two):
        assert not [c for c in calls if "ncclCommSplit" in c], calls
    # Nothing was issued on the parent: it goes on.
    sums = run_ranks(groups, lambda rank, pg, gpu: _all_reduce(pg, gpu, rank + 1))
    assert [s.tolist() for s in sums] == [[6.0] * 4] * 3
    shut_down(groups)


def test_ranks_whose_split_never_completes_abort_the_parent_within_the_timeout():
    # Rank 3 agrees to the split (its Store key is written here for it) but never calls
    # ncclCommSplit, so NCCL waits for it on the others. Their timeout ends that, and only the
    # parent's abort ends NCCL's part in it: the parent breaks, and says so.
    store = dist.HashStore()
    groups = connect(fake_ranks(4, timeout=timedelta(seconds=2), store=store))
    live = "streamnccl/split/0/streamnccl/live/"
    stores = _subgroup_stores([[0, 1]])

    def split_without_rank_three(rank, pg, gpu):
        if rank == 3:
            store.wait([live + "0"])
            store.set(live + "3", store.get(live + "0"))
            return None
        gpu.clear()
        with pytest.raises(dist.DistBackendError, match="did not finish|another member gave up"):
            if rank == 2:
                pg.perform_nocolor_split(CPU)
            else:
                pg._split(stores[(0, 1)], [0, 1])
        with pytest.raises(dist.DistBackendError):
            _all_reduce(pg, gpu, 1)  # the parent is broken
        return gpu.calls()

    calls = run_ranks(groups, split_without_rank_three)
    for rank_calls in calls[:3]:
        split = next(i for i, c in enumerate(rank_calls) if c.startswith("ncclCommSplit(C0"))
        assert "ncclCommAbort(C0)" in rank_calls[split:], rank_calls
    for pg, gpu in groups:
        pg.abort()
        assert gpu.violations() == []


def test_a_member_whose_split_fails_ends_the_others_at_once():
    # Rank 0's ncclCommSplit fails: ranks 1 and 2, whose NCCL would wait for rank 0 until their
    # timeout (a minute here), end at once and say why. Only the parent's abort ends NCCL's
    # making of the new communicator, so the parent breaks on every rank.
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=60)))
    stores = _subgroup_stores([[0, 1]])

    def one_fails(rank, pg, gpu):
        gpu.clear()
        if rank == 0:
            gpu.fail_next("ncclCommSplit")
        expected = "injected failure" if rank == 0 else "another member gave up.*injected"
        with pytest.raises(dist.DistBackendError, match=expected):
            if rank == 2:
                pg.perform_nocolor_split(CPU)
            else:
                pg._split(stores[(0, 1)], [0, 1])
        return gpu.calls()

    calls = run_ranks(groups, one_fails, timeout_s=30)
    for other in calls[1:]:
        # One that had called ncclCommSplit already ended it by the parent's abort; one still
        # agreeing on what to split called nothing.
        if any(c.startswith("ncclCommSplit") for c in other):
            assert "ncclCommAbort(C0)" in other, other
    for pg, gpu in groups:
        pg.abort()
        assert gpu.violations() == []


def test_a_split_with_split_share_shares_the_parents_resources():
    # NcclConfig(split_share=True) is the user's choice: NCCL then gives the new communicator
    # the parent's resources, its abort flag among them.
    groups = connect(fake_ranks(2, config=streamnccl.NcclConfig(split_share=True)))
    parts = [[0, 1]]
    results = run_ranks(groups, _split(parts, _subgroup_stores(parts)))
    for _, gathered, calls in results:
        assert gathered == [10, 11]
        assert calls[0].endswith("-> C1, sharing its parent's resources"), calls
    _end(groups, results)


def _bound_default_group(monkeypatch, parent):
    """Stands in torch's default group, bound to the fake's device with `parent` its backend
    there, as after init_process_group(device_id=...)."""

    class DefaultGroup:
        bound_device_id = CPU

        @staticmethod
        def _get_backend(device):
            assert device == CPU
            return parent

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", DefaultGroup)


def _backend_options(group_id):
    """What torch hands streamnccl's creator for new_group's group named `group_id`."""
    return SimpleNamespace(
        store=dist.HashStore(), group_rank=0, group_size=1, timeout=timedelta(seconds=10),
        group_id=group_id, global_ranks_in_group=[0],
    )  # fmt: skip


def test_new_group_on_a_bound_default_group_is_split_from_it(monkeypatch):
    parent, gpu = connect([fake_group(rank=0, size=1)])[0]
    _bound_default_group(monkeypatch, parent)
    gpu.clear()
    child = streamnccl._create_backend(_backend_options("1"), None)
    assert gpu.calls()[0] == "ncclCommSplit(C0, color=0, key=0) -> C1", gpu.calls()
    assert child.options.group_name == "1"  # NCCL's logs name the new group
    assert _all_reduce(child, gpu, 3).tolist() == [3.0] * 4
    child.shutdown()
    parent.shutdown()


def test_new_group_with_local_synchronization_is_not_split(monkeypatch):
    # torch names such a group by a hash, and the ranks outside it never call new_group: a
    # split would wait for them.
    parent, gpu = connect([fake_group(rank=0, size=1)])[0]
    _bound_default_group(monkeypatch, parent)
    gpu.clear()
    child = streamnccl._create_backend(_backend_options("3f2c9a"), None)
    assert isinstance(child, streamnccl.ProcessGroup)
    assert gpu.calls() == []
    child.shutdown()
    parent.shutdown()
