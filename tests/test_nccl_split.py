"""Subgroups split from their parent on the NCCL path, over the fake GPU: where the parent's
communicator is live on every rank, split_group and new_group make the subgroup's with
ncclCommSplit, every rank of the parent taking part (those outside the subgroup with
NCCL_SPLIT_NOCOLOR); otherwise the subgroup connects afresh at its first op, as before.
"""

import gc
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import streamnccl
import torch
import torch.distributed as dist
from fakes import (
    CPU,
    connect,
    fake_ranks,
    needs_nccl_path,
    opts,
    run_child,
    run_ranks,
    shut_down,
)
from streamnccl import _testing
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions

pytestmark = needs_nccl_path


@pytest.fixture(autouse=True)
def fresh_thread_state():
    yield
    gc.collect()
    _testing.FakeGpu.forget_thread_device()


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


def _split(parts, stores, take_part=None, options=None):
    """Every rank calls split with its own part (those in none, with the first), as torch's
    split_group does; a member gathers 10 + its parent rank in the subgroup."""

    def program(rank, pg, gpu):
        gpu.clear()
        mine = next((part for part in parts if rank in part), parts[0])
        if take_part is not None and rank not in mine:
            take_part(rank, pg)
            return None, None, gpu.calls()
        child = pg._split(stores[tuple(mine)], mine, options)
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_ranks_whose_split_never_completes_abort_the_parent_within_the_timeout():
    # Rank 3 agrees to the split (its Store key is written here for it) but never calls
    # ncclCommSplit, so NCCL waits for it on the others. Their timeout ends that, and only the
    # parent's abort ends NCCL's part in it: the parent breaks, and says so.
    store = dist.HashStore()
    groups = connect(fake_ranks(4, timeout=timedelta(seconds=2), store=store))
    agreement = "streamnccl/split/0/streamnccl/"
    stores = _subgroup_stores([[0, 1]])

    def split_without_rank_three(rank, pg, gpu):
        if rank == 3:  # counts itself in with its communicator live, as a rank that splits
            store.add(agreement + "live/streamnccl/ncclUniqueId/0", 1)
            store.add(agreement + "arrived", 1)
            return None
        gpu.clear()
        with pytest.raises(dist.DistBackendError, match="did not finish|another member gave up"):
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


def test_a_failed_split_breaks_the_parents_group():
    # Every rank's ncclCommSplit is held in progress; once all three are in it, rank 0's parent
    # is aborted, which fails its split. Only the parent's abort ends the others' part in it,
    # and an abort stops the parent's kernels, whose ops would then pass their end events as if
    # they had run: so the parent's group breaks (failing its ops in flight first), and every
    # later op on it says why, rather than the communicator being aborted behind its back.
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=60)))
    stores = _subgroup_stores([[0, 1]])
    for _, gpu in groups:
        gpu.clear()
        gpu.hold_shrinks(True)

    def all_in_their_split():
        return all(any(c.startswith("ncclCommSplit") for c in gpu.calls()) for _, gpu in groups)

    def abort_rank_zero_once_all_split():
        deadline = time.monotonic() + 20
        while not all_in_their_split() and time.monotonic() < deadline:
            time.sleep(0.005)  # polling a condition
        groups[0][0].abort()

    def one_fails(rank, pg, gpu):
        expected = "aborted" if rank == 0 else "another member gave up"
        with pytest.raises(dist.DistBackendError, match=expected):
            pg._split(stores[(0, 1)], [0, 1])
        if rank > 0:
            broken = "unusable since.*ncclCommSplit of this communicator failed"
            with pytest.raises(dist.DistBackendError, match=broken):
                pg.allreduce([torch.ones(4)], opts(AllreduceOptions)).wait()
        return gpu.calls()

    controller = threading.Thread(target=abort_rank_zero_once_all_split)
    controller.start()
    try:
        run_ranks(groups, one_fails, timeout_s=30)
    finally:
        controller.join()
    for pg, gpu in groups:
        gpu.hold_shrinks(False)
        pg.abort()
        assert gpu.violations() == []


def test_a_split_waits_for_the_parents_ops_in_flight_and_fails_when_they_never_end():
    # NCCL's split needs the parent's operations finished. Ranks 1 and 2 issue an all_reduce
    # rank 0 never joins, then split: they wait for it up to the timeout, then fail saying
    # why, and rank 0, waiting in the split's agreement, learns of it at once.
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=2)))
    stores = _subgroup_stores([[0, 1]])

    def stuck_then_split(rank, pg, gpu):
        gpu.clear()
        if rank > 0:
            pg.allreduce([torch.ones(4)], opts(AllreduceOptions))
        expected = "another member gave up" if rank == 0 else "ops in flight did not end"
        with pytest.raises(dist.DistBackendError, match=expected):
            pg._split(stores[(0, 1)], [0, 1])
        return gpu.calls()

    for calls in run_ranks(groups, stuck_then_split, timeout_s=30):
        assert not [c for c in calls if c.startswith("ncclCommSplit")], calls
    for pg, gpu in groups:
        pg.abort()
        assert gpu.violations() == []


def test_a_split_on_another_device_is_made_with_that_device_current():
    # NCCL makes the new communicator on the device current when ncclCommSplit is called; the
    # thread that calls it starts on device 0, as every CUDA thread does.
    groups = connect(fake_ranks(2, device_index=1))
    stores = _subgroup_stores([[0, 1]])
    results = run_ranks(groups, _split([[0, 1]], stores))
    assert [gathered for _, gathered, _ in results] == [[10, 11], [10, 11]]
    _end(groups, results)
    for _, gpu in groups:
        assert gpu.violations() == []


def test_a_communicator_that_failed_to_be_made_is_freed_only_after_its_parents_abort():
    # NCCL links a parent to the abort flag of the communicator it is making, and unlinks it
    # only once that is made well: freeing a failed one first leaves the parent's abort to
    # write through freed memory (the fake's violation). Rank 1's new communicator fails.
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=60)))
    stores = _subgroup_stores([[0, 1]])

    def rank_one_fails_to_make_it(rank, pg, gpu):
        gpu.clear()
        if rank == 1:
            gpu.fail_next("making a communicator")
            with pytest.raises(dist.DistBackendError, match="ncclCommSplit"):
                pg._split(stores[(0, 1)], [0, 1])
            gc.collect()  # what was made is let go of
            with pytest.raises(dist.DistBackendError, match="failed"):
                _all_reduce(pg, gpu, 1)  # the parent's group broke
            return None
        try:
            return pg._split(stores[(0, 1)], [0, 1])
        except dist.DistBackendError:
            return None  # rank 0 may have learnt of rank 1's failure first

    children = run_ranks(groups, rank_one_fails_to_make_it, timeout_s=30)
    for child in children:
        if child is not None:
            child.abort()
    for pg, gpu in groups:
        pg.abort()
        assert gpu.violations() == []


def test_split_share_is_refused_where_the_group_is_made(monkeypatch):
    # NCCL would give a split communicator its parent's abort flag, both ways: a subgroup that
    # breaks would stop the parent's kernels, which then fail silently.
    with pytest.raises(ValueError, match="config.split_share is true"):
        streamnccl.Options(config=streamnccl.NcclConfig(split_share=True)).resolved()
    monkeypatch.setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1")
    with pytest.raises(ValueError, match="NCCL_COMM_SPLIT_SHARE_RESOURCES is set"):
        streamnccl.Options().resolved()


def test_the_fake_shares_the_abort_flag_of_a_parent_made_with_split_share():
    # The model behind that refusal (the recording group takes its config unchecked).
    groups = connect(fake_ranks(2, config=streamnccl.NcclConfig(split_share=True)))
    parts = [[0, 1]]
    own = streamnccl.Options()  # the subgroup's, checked: without split_share
    own._timeout = timedelta(seconds=20)
    results = run_ranks(groups, _split(parts, _subgroup_stores(parts), options=own))
    for _, gathered, calls in results:
        assert gathered == [10, 11]
        assert calls[0].endswith("-> C1, sharing its parent's resources"), calls
    _end(groups, results)


class _BoundWorld:
    """torch's making of new groups over fake ranks (threads of this process), after
    init_process_group(device_id=...): a default group bound to the fake's device, whose
    backend there is the calling rank's group."""

    def __init__(self, monkeypatch, groups):
        self.parents = {}  # by thread
        self.stores = {}  # by new group's name, as torch's prefix store per group
        world = self

        class DefaultGroup:
            bound_device_id = CPU

            @staticmethod
            def _get_backend(device):
                assert device == CPU
                return world.parents[threading.get_ident()]

        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", DefaultGroup)

    def new_group(self, rank, pg, ranks, group_name, backend="streamnccl", options=None):
        self.parents[threading.get_ident()] = pg
        store = self.stores.setdefault(group_name, dist.HashStore())
        return _new_process_group_helper(rank, ranks, backend, store, group_name, options)


def _new_process_group_helper(
    global_rank, global_ranks_in_group, backend, store, group_name, backend_options=None
):
    """What torch's function of this name does for new_group with a bound default group; its
    locals `split_from`, `backend` and `group_name` are the ones streamnccl reads, as in torch's.
    `split_from` as torch 2.11 to 2.14 choose it: the bound device's backend, whatever the new
    group's (2.15 leaves it None unless the backends match, which streamnccl checks anyway)."""
    default = dist.distributed_c10d._get_default_group()
    split_from = default._get_backend(default.bound_device_id)
    if global_rank not in global_ranks_in_group:
        if split_from:
            split_from.perform_nocolor_split(default.bound_device_id)
        return None
    if (
        dist.distributed_c10d.BackendConfig(dist.Backend(backend))
        .get_device_backend_map()
        .get("cuda")
        != "streamnccl"
    ):
        return "made by another backend"
    options = SimpleNamespace(
        store=store, group_rank=global_ranks_in_group.index(global_rank),
        group_size=len(global_ranks_in_group), timeout=timedelta(seconds=20),
        group_id=group_name, global_ranks_in_group=global_ranks_in_group,
    )  # fmt: skip
    return streamnccl._create_backend(options, backend_options)


@pytest.mark.torch_internals
def test_new_group_on_a_bound_default_group_is_split_from_it(monkeypatch):
    # The members split in the creator, the others in perform_nocolor_split, all meeting under
    # the new group's name; then a second new_group, of all ranks.
    groups = connect(fake_ranks(3))
    torch_ = _BoundWorld(monkeypatch, groups)

    def two_new_groups(rank, pg, gpu):
        gpu.clear()
        some = torch_.new_group(rank, pg, [1, 2], "1")
        gathered = _gather(some, gpu, 10 + rank) if some else None
        every = torch_.new_group(rank, pg, [0, 1, 2], "2")
        return some, gathered, every, _gather(every, gpu, 20 + rank), gpu.calls()

    results = run_ranks(groups, two_new_groups)
    assert [r[1] for r in results] == [None, [11, 12], [11, 12]]
    assert [r[3] for r in results] == [[20, 21, 22]] * 3
    for rank, (_, _, every, _, calls) in enumerate(results):
        splits = [c for c in calls if c.startswith("ncclCommSplit")]
        first = "color=NOCOLOR, key=0" if rank == 0 else f"color=1, key={rank - 1}"
        assert splits[0].startswith(f"ncclCommSplit(C0, {first})"), splits
        assert splits[1].startswith(f"ncclCommSplit(C0, color=0, key={rank})"), splits
        assert not [c for c in calls if c.startswith("ncclCommInitRank")], calls
        assert every.options.group_name == "2"  # NCCL's logs name the new group
    children = [
        (child, gpu)
        for (some, _, every, _, _), (_, gpu) in zip(results, groups, strict=True)
        for child in (some, every)
        if child
    ]
    run_ranks(children, lambda rank, child, gpu: child.shutdown())
    shut_down(groups)
    for _, gpu in groups:
        assert gpu.violations() == []


@pytest.mark.torch_internals
def test_a_subset_group_of_another_backend_leaves_the_others_out_of_any_split(monkeypatch):
    # new_group([0, 1], backend="gloo") on a bound world: torch still calls
    # perform_nocolor_split on rank 2, whose members never reach streamnccl. It must neither
    # wait for them nor throw later splits out of step.
    groups = connect(fake_ranks(3))
    torch_ = _BoundWorld(monkeypatch, groups)
    stores = _subgroup_stores([[0, 1]])

    def gloo_group_then_split(rank, pg, gpu):
        gpu.clear()
        torch_.new_group(rank, pg, [0, 1], "1", backend="gloo")
        assert gpu.calls() == []
        child = pg._split(stores[(0, 1)], [0, 1])
        return child, _gather(child, gpu, 10 + rank) if child else None, gpu.calls()

    results = run_ranks(groups, gloo_group_then_split)
    assert [gathered for _, gathered, _ in results] == [[10, 11], [10, 11], None]
    assert results[2][2][0].startswith("ncclCommSplit(C0, color=NOCOLOR"), results[2][2]
    _end(groups, results)


@pytest.mark.torch_internals
def test_new_group_with_local_synchronization_is_not_split(monkeypatch):
    # torch names such a group by a hash, and the ranks outside it never call new_group: a
    # split would wait for them. Its members connect afresh.
    groups = connect(fake_ranks(2))
    torch_ = _BoundWorld(monkeypatch, groups)

    def members_only(rank, pg, gpu):
        gpu.clear()
        group = torch_.new_group(rank, pg, [0, 1], "3f2c9a7e")
        return group, _gather(group, gpu, 10 + rank), gpu.calls()

    results = run_ranks(groups, members_only)
    for _, gathered, calls in results:
        assert gathered == [10, 11]  # over paths of its own (here a real group's, on CPU)
        assert calls == [], calls  # nothing of the default group's
    _end(groups, results)


def test_a_rank_outside_takes_part_in_each_of_two_splits_in_a_row():
    # torch makes a fresh store for each split_group and drops it; the next one may be made at
    # the same address. A rank outside both subgroups must still take part in the second split
    # (it was taken for torch's second ask of the first, and skipped).
    groups = connect(fake_ranks(3))
    base = dist.HashStore()

    def two_splits(rank, pg, gpu):
        gpu.clear()
        gathered = []
        for n in range(2):
            child = pg._split(dist.PrefixStore(f"split{n}/", base), [0, 1])
            gathered.append(_gather(child, gpu, 10 + rank) if child else None)
            gathered.append(child)
        return gathered, gpu.calls()

    results = run_ranks(groups, two_splits)
    nocolor = [c for c in results[2][1] if "color=NOCOLOR" in c]
    assert len(nocolor) == 2, results[2][1]
    for rank in (0, 1):
        gathered = results[rank][0]
        assert gathered[0] == gathered[2] == [10, 11]
    children = [
        (child, gpu)
        for (gathered, _), (_, gpu) in zip(results[:2], groups[:2], strict=True)
        for child in gathered[1::2]
    ]
    run_ranks(children, lambda rank, child, gpu: child.shutdown())
    shut_down(groups)


def test_a_rank_arriving_after_the_others_gave_up_makes_no_split_and_breaks_nothing():
    # Rank 1 comes only once rank 0 has given up waiting for it: it must not start an NCCL split
    # rank 0 will never make (and then abort its healthy parent to end it). The split waits
    # 1 s; the parents keep their own, longer timeout.
    groups = connect(fake_ranks(2))
    stores = _subgroup_stores([[0, 1]])
    brief = streamnccl.Options()
    brief._timeout = timedelta(seconds=1)
    rank_zero_gave_up = threading.Event()

    def late_rank_one(rank, pg, gpu):
        gpu.clear()
        if rank == 1:
            assert rank_zero_gave_up.wait(20)
        with pytest.raises(dist.DistBackendError, match="within 1000 ms|another member gave up"):
            pg._split(stores[(0, 1)], [0, 1], brief)
        rank_zero_gave_up.set()
        return gpu.calls()

    for calls in run_ranks(groups, late_rank_one):
        assert calls == [], calls
    sums = run_ranks(groups, lambda rank, pg, gpu: _all_reduce(pg, gpu, rank + 1))
    assert [s.tolist() for s in sums] == [[3.0] * 4] * 2  # both parents go on
    shut_down(groups)


def test_a_member_whose_new_group_options_are_refused_ends_the_others_wait(monkeypatch):
    groups = connect(fake_ranks(3, timeout=timedelta(seconds=120)))
    torch_ = _BoundWorld(monkeypatch, groups)
    refused = streamnccl.Options(config=streamnccl.NcclConfig(split_share=True))

    def refused_on_members(rank, pg, gpu):
        gpu.clear()
        expected = "split_share" if rank else "another member gave up.*split_share"
        with pytest.raises((ValueError, dist.DistBackendError), match=expected):
            torch_.new_group(rank, pg, [1, 2], "1", options=refused)
        return gpu.calls()

    # Within the run's 30 s, not the group's 120 s timeout: rank 0 learns at once.
    for calls in run_ranks(groups, refused_on_members):
        assert calls == [], calls
    shut_down(groups)


TORCHS_OWN_NEW_GROUP = """
    import threading
    from datetime import timedelta
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    groups = t.connect(t.fake_ranks(2))
    parents = {}

    class DefaultGroup:  # bound to the fake's device, as after init_process_group(device_id=...)
        bound_device_id = t.CPU

        @staticmethod
        def _get_backend(device):
            return parents[threading.get_ident()][0]

        @staticmethod
        def rank():
            return parents[threading.get_ident()][1]

    class WorldOfThisThread:  # torch's record of the groups, one per rank as per process
        def __init__(self):
            object.__setattr__(self, "of", threading.local())

        def world(self):
            if not hasattr(self.of, "world"):
                self.of.world = c10d._World()
                self.of.world.pg_map[DefaultGroup] = ("streamnccl", None)  # torch 2.15 asks
            return self.of.world

        def __getattr__(self, name):
            return getattr(self.world(), name)

        def __setattr__(self, name, value):
            setattr(self.world(), name, value)

    c10d.is_initialized = lambda: True
    dist.is_initialized = lambda: True
    c10d._get_default_group = lambda: DefaultGroup
    c10d._world = WorldOfThisThread()
    base = dist.HashStore()

    made = {}  # by rank: the groups torch made

    def two_groups(rank, pg, gpu):
        parents[threading.get_ident()] = (pg, rank)
        gpu.clear()
        for name, members in (("1", [1]), ("2", [0])):
            group, _ = c10d._new_process_group_helper(
                len(members), members.index(rank) if rank in members else -1, members,
                c10d.Backend("streamnccl"), base, c10d.GroupName(name),
                timeout=timedelta(seconds=20),
            )
            if isinstance(group, dist.ProcessGroup):
                made.setdefault(rank, []).append(group._get_backend(t.CPU))
        return [c.split(" -> ")[0] for c in gpu.calls() if c.startswith("ncclCommSplit")]

    print(t.run_ranks(groups, two_groups))
    # Every rank ends its groups at once, as separate processes would: one thread ending them
    # in turn would wait for the others' finalize.
    t.run_ranks(groups, lambda rank, pg, gpu: [child.shutdown() for child in made.get(rank, [])])
    t.shut_down(groups)
"""


@pytest.mark.torch_internals
@pytest.mark.slow
def test_torchs_own_new_group_splits_alike_on_members_and_the_others():
    # Through torch's _new_process_group_helper itself (in a child: it registers groups in
    # torch's world), whose frame streamnccl reads on both sides.
    printed = run_child("test_nccl_split", TORCHS_OWN_NEW_GROUP)
    assert printed.strip().splitlines()[-1] == str([
        ["ncclCommSplit(C0, color=NOCOLOR, key=0)", "ncclCommSplit(C0, color=0, key=0)"],
        ["ncclCommSplit(C0, color=1, key=0)", "ncclCommSplit(C0, color=NOCOLOR, key=0)"],
    ])  # fmt: skip


def test_a_rank_whose_split_group_options_are_refused_ends_the_others_and_keeps_count():
    # One rank's pg_options are refused (a ValueError there): the others, waiting for it under
    # a 120 s timeout, end at once; every rank still counts the split, so the next one meets.
    groups = connect(fake_ranks(2, timeout=timedelta(seconds=120)))
    stores = [_subgroup_stores([[0, 1]]) for _ in range(2)]
    refused = streamnccl.Options(config=streamnccl.NcclConfig(split_share=True))
    fine = streamnccl.Options()
    fine._timeout = timedelta(seconds=120)

    def refused_on_rank_zero(rank, pg, gpu):
        gpu.clear()
        expected = "split_share" if rank == 0 else "another member gave up.*split_share"
        with pytest.raises((ValueError, dist.DistBackendError), match=expected):
            pg._split(stores[0][(0, 1)], [0, 1], refused if rank == 0 else fine)
        assert gpu.calls() == []
        child = pg._split(stores[1][(0, 1)], [0, 1], fine)
        return child, _gather(child, gpu, 10 + rank), gpu.calls()

    results = run_ranks(groups, refused_on_rank_zero)
    for _, gathered, calls in results:
        assert gathered == [10, 11]
        assert calls[0].startswith("ncclCommSplit(C0, color=0"), calls
    _end(groups, results)
