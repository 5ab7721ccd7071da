"""The measured ops: how each is called, its buffers, its result, and nccl-tests' accounting.

A message size is nccl-tests' size column, S bytes: the buffer of all_reduce, broadcast,
reduce and send_recv; the whole gathered output of all_gather; the whole input of
reduce_scatter; each rank's whole buffer of all_to_all. algbw = S / time and busbw = algbw
times the op's factor (nccl-tests' doc/PERFORMANCE.md), so busbw can be compared with the
hardware's bandwidth whatever the number of ranks.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .check import pattern, reduced


@dataclass
class Buffers:
    input: torch.Tensor
    output: torch.Tensor  # the same tensor as input for the in-place ops


class Collective:
    name = ""
    reduces = False  # takes --redop
    root = -1  # the rank a rooted op starts or ends at; -1 for none, as nccl-tests prints
    chunked = False  # S is world_size equal chunks, so its count must divide by world_size
    min_world_size = 1

    def bus_factor(self, world_size: int) -> float:
        return 1.0

    def count(self, nbytes: int, element_size: int, world_size: int) -> int:
        """Elements of the message nearest below `nbytes` that the op can take (at least one
        element per rank), as nccl-tests rounds its sizes."""
        count = nbytes // element_size
        if self.chunked:
            count -= count % world_size
            return max(count, world_size)
        return max(count, 1)

    def buffers(self, count, rank, world_size, dtype, device, redop) -> Buffers:
        data = pattern(rank, 0, count, redop, device).to(dtype)
        return Buffers(data, data)

    def launch(self, buffers: Buffers, group, redop, async_op: bool) -> list:
        """Issues the op once; returns the Works to wait on (none for a sync op)."""
        raise NotImplementedError

    def expected(self, count, rank, world_size, redop, device) -> torch.Tensor | None:
        """This rank's exact result in float64; None where the rank has none (a non-root
        rank of reduce)."""
        raise NotImplementedError


def _works(work) -> list:
    return [] if work is None else [work]


class AllReduce(Collective):
    name = "all_reduce"
    reduces = True

    def bus_factor(self, world_size):
        return 2 * (world_size - 1) / world_size

    def launch(self, buffers, group, redop, async_op):
        return _works(dist.all_reduce(buffers.input, op=redop, group=group, async_op=async_op))

    def expected(self, count, rank, world_size, redop, device):
        return reduced(world_size, 0, count, redop, device)


class AllGather(Collective):
    name = "all_gather"
    chunked = True

    def bus_factor(self, world_size):
        return (world_size - 1) / world_size

    def buffers(self, count, rank, world_size, dtype, device, redop):
        chunk = count // world_size
        data = pattern(rank, 0, chunk, redop, device).to(dtype)
        return Buffers(data, torch.zeros(count, dtype=dtype, device=device))

    def launch(self, buffers, group, redop, async_op):
        work = dist.all_gather_into_tensor(
            buffers.output, buffers.input, group=group, async_op=async_op
        )
        return _works(work)

    def expected(self, count, rank, world_size, redop, device):
        chunk = count // world_size
        return torch.cat([pattern(r, 0, chunk, redop, device) for r in range(world_size)])


class ReduceScatter(Collective):
    name = "reduce_scatter"
    reduces = True
    chunked = True

    def bus_factor(self, world_size):
        return (world_size - 1) / world_size

    def buffers(self, count, rank, world_size, dtype, device, redop):
        data = pattern(rank, 0, count, redop, device).to(dtype)
        return Buffers(data, torch.zeros(count // world_size, dtype=dtype, device=device))

    def launch(self, buffers, group, redop, async_op):
        work = dist.reduce_scatter_tensor(
            buffers.output, buffers.input, op=redop, group=group, async_op=async_op
        )
        return _works(work)

    def expected(self, count, rank, world_size, redop, device):
        chunk = count // world_size
        return reduced(world_size, rank * chunk, chunk, redop, device)


class Broadcast(Collective):
    name = "broadcast"
    root = 0

    def launch(self, buffers, group, redop, async_op):
        return _works(dist.broadcast(buffers.input, src=self.root, group=group, async_op=async_op))

    def expected(self, count, rank, world_size, redop, device):
        return pattern(self.root, 0, count, redop, device)


class Reduce(Collective):
    name = "reduce"
    reduces = True
    root = 0

    def launch(self, buffers, group, redop, async_op):
        work = dist.reduce(buffers.input, dst=self.root, op=redop, group=group, async_op=async_op)
        return _works(work)

    def expected(self, count, rank, world_size, redop, device):
        if rank != self.root:
            return None  # what a non-root rank's buffer holds afterwards is unspecified
        return reduced(world_size, 0, count, redop, device)


class AllToAll(Collective):
    name = "all_to_all"
    chunked = True

    def bus_factor(self, world_size):
        return (world_size - 1) / world_size

    def buffers(self, count, rank, world_size, dtype, device, redop):
        data = pattern(rank, 0, count, redop, device).to(dtype)
        return Buffers(data, torch.zeros_like(data))

    def launch(self, buffers, group, redop, async_op):
        work = dist.all_to_all_single(buffers.output, buffers.input, group=group, async_op=async_op)
        return _works(work)

    def expected(self, count, rank, world_size, redop, device):
        # Chunk r of this rank's output is chunk `rank` of rank r's input.
        chunk = count // world_size
        return torch.cat(
            [pattern(r, rank * chunk, chunk, redop, device) for r in range(world_size)]
        )


class SendRecv(Collective):
    """Every rank sends to the next and receives from the previous, around the ring, both
    at once (with 2 ranks, a pair exchanging messages), as nccl-tests' sendrecv.

    It is one batch_isend_irecv, sync or --async: a blocking send before a blocking receive
    on every rank would wait in a circle, and NCCL needs the pair grouped for the same
    reason. So its Works are always waited on.
    """

    name = "send_recv"
    min_world_size = 2  # torch refuses a send to oneself

    def buffers(self, count, rank, world_size, dtype, device, redop):
        data = pattern(rank, 0, count, redop, device).to(dtype)
        return Buffers(data, torch.zeros_like(data))

    def launch(self, buffers, group, redop, async_op):
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        return dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, buffers.input, (rank + 1) % world_size, group),
                dist.P2POp(dist.irecv, buffers.output, (rank - 1) % world_size, group),
            ]
        )

    def expected(self, count, rank, world_size, redop, device):
        return pattern((rank - 1) % world_size, 0, count, redop, device)


COLLECTIVES = {
    op.name: op
    for op in (AllReduce(), AllGather(), ReduceScatter(), Broadcast(), Reduce(), AllToAll(),
               SendRecv())
}  # fmt: skip
