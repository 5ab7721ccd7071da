"""Run under torchrun with 3 ranks: ranks 0 and 1 all_reduce where rank 2 broadcasts.

Every rank's op fails within the group's timeout, and each rank leaves its flight recorder in
STREAMNCCL_DUMP_DIR, for torch's analyzer (tests/test_observability.py) to find the mismatch.
"""

from datetime import timedelta

import streamnccl  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist

dist.init_process_group("streamnccl", timeout=timedelta(seconds=3))
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)  # collective 1 matches everywhere
try:
    if rank == 2:
        dist.broadcast(x, src=0)
    else:
        dist.all_reduce(x)
    raise SystemExit(f"rank {rank}: the mismatched collective did not fail")
except dist.DistBackendError as error:
    print(f"rank {rank} failed as expected: {str(error)[:120]}")
dist.destroy_process_group()
