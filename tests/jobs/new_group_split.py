"""Run under torchrun with 3 ranks: torch's own new_group on a default group bound to a device,
as after init_process_group(device_id=cuda:N), over every torch release streamnccl supports.
The subgroup's making is torch's (_new_process_group_helper), whose choices streamnccl reads
(python/streamnccl/__init__.py, _split_source): each rank writes, as JSON, which of its splits
streamnccl made for each new group, for tests/test_groups.py to check.

No GPU is needed: the default group is bound after init (no connection is made), and the
subgroups' eager connection of that device is skipped, so their CPU tensors take the host path.
"""

import json
from pathlib import Path

import streamnccl
import torch
import torch.distributed as dist

dist.init_process_group("streamnccl")
rank, size = dist.get_rank(), dist.get_world_size()
dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
streamnccl.ProcessGroup.eager_connect_single_device = lambda self, device: None

splits = []  # (what this rank did, the split's agreement), in order
split, split_without = streamnccl.ProcessGroup._split, streamnccl.ProcessGroup._split_without


def spy_split(self, *args, **kwargs):
    splits.append(["split", kwargs.get("agreement")])
    return split(self, *args, **kwargs)


def spy_split_without(self, *args, **kwargs):
    splits.append(["split_without", kwargs.get("agreement")])
    return split_without(self, *args, **kwargs)


streamnccl.ProcessGroup._split = spy_split
streamnccl.ProcessGroup._split_without = spy_split_without

made = {}
for name, ranks, kwargs in [
    # Named by a hash, never split. Of every rank, and first: torch counts such a group only
    # on the ranks that make it (2.15), or hashes the number of groups each rank is in
    # (2.11 to 2.14), so a group made on some ranks only puts their names out of step.
    ("local_sync", [0, 1, 2], {"use_local_synchronization": True}),
    ("last_two", [1, 2], {}),  # split from the default group, rank 0 taking part
    ("gloo", [0, 1], {"backend": "gloo"}),  # another backend's: no split
]:
    splits.clear()
    group = dist.new_group(ranks, **kwargs)
    if rank in ranks:
        x = torch.full((2,), float(rank))
        dist.all_reduce(x, group=group)
        assert x.tolist() == [float(sum(ranks))] * 2, x
    made[name] = list(splits)

# A file per rank, in the folder it runs in: the ranks' printed lines could interleave.
Path(f"splits_rank_{rank}.json").write_text(json.dumps(made))
dist.destroy_process_group()
