"""The exact CUDA and NCCL calls of the NCCL path, checked without a GPU.

A group built on recording fakes of NcclApi and CudaApi (csrc/fake/) sends its CPU tensors
down the real NCCL path: the same core, CudaDevice and NcclCommunicator, with every nccl* and
stream/event call written to a log instead of run. Names are given in order of creation:
streams S0 (the caller's current) and S1.. (from the pool), events E1.., communicators C0..,
PreMulSum ops R0.. Everything runs as rank 0 of 3 in this process; roots and peers other than
0 show the other ranks' side.
"""

import time
from datetime import timedelta

import pytest
import streamnccl
import torch
import torch.distributed as dist
from streamnccl import _testing
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

pytestmark = pytest.mark.skipif(
    not hasattr(_testing, "recording_process_group"),
    reason="this build has no NCCL path (STREAMNCCL_BUILD_NCCL=0 or a CPU-only torch)",
)

SIZE = 3
CPU = torch.device("cpu")  # the recorded group's "cuda" tensors
INIT = ["ncclGetUniqueId()", "ncclCommInitRank(nranks=3, rank=0, nonblocking) -> C0"]


def recorded_group(high_priority_streams=False, timeout=timedelta(seconds=10)):
    return _testing.recording_process_group(
        dist.HashStore(), 0, SIZE, timeout, high_priority_streams
    )


def options(kind, async_op=True, **fields):
    opts = kind()
    opts.asyncOp = async_op
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def run(pg, log, call):
    """The calls `call` makes, including its Work's wait(), as torch.distributed waits."""
    log.clear()
    work = call(pg)
    if work is not None:
        work.wait()
    return log.calls()


def test_async_all_reduce_follows_the_stream_contract():
    pg, log = recorded_group()
    x = torch.ones(4)
    assert run(pg, log, lambda pg: pg.allreduce([x], options(AllreduceOptions))) == [
        *INIT,
        "cudaStreamCreateWithPriority(low) -> S1",  # the internal stream, made on first use
        "cudaEventCreate() -> E1",
        "cudaEventRecord(E1, S0)",  # ready: after the caller's work so far
        "cudaStreamWaitEvent(S1, E1)",  # the internal stream waits for it; the host does not
        "ncclAllReduce(count=4, ncclFloat32, ncclSum, C0, S1)",
        "cudaEventCreate() -> E2",
        "cudaEventRecord(E2, S1)",  # end, kept by the Work
        "cudaStreamWaitEvent(S0, E2)",  # wait(): the caller's stream waits for end
    ]


# all_to_all as sends and recvs: 8 bytes each way with each other rank, in one group.
EXCHANGE_8_BYTES_WITH_EACH_PEER = [
    "ncclGroupStart()",
    "ncclSend(count=8, ncclUint8, peer=1, C0, {s})",
    "ncclRecv(count=8, ncclUint8, peer=1, C0, {s})",
    "ncclSend(count=8, ncclUint8, peer=2, C0, {s})",
    "ncclRecv(count=8, ncclUint8, peer=2, C0, {s})",
    "ncclGroupEnd()",
]

# After a sync op, only an event for the watchdog; no stream waits.
SYNC_END = ["cudaEventCreate() -> E1", "cudaEventRecord(E1, S0)"]


def test_sync_op_is_one_call_on_the_callers_stream():
    pg, log = recorded_group()
    x = torch.ones(4)
    calls = run(pg, log, lambda pg: pg.allreduce([x], options(AllreduceOptions, False)))
    assert calls == [*INIT, "ncclAllReduce(count=4, ncclFloat32, ncclSum, C0, S0)", *SYNC_END]


def test_with_call_recording_off_nothing_is_written_down_and_the_op_still_runs():
    # The launch benchmark's switch (python -m streamnccl.bench.launch): ops run and move their
    # data as before; only the log stays empty, so that it does not grow with every op.
    pg, log = recorded_group()
    x = torch.ones(4)
    pg.allreduce([x], options(AllreduceOptions, False)).wait()
    log.record_calls(False)
    log.clear()
    pg.allreduce([x], options(AllreduceOptions)).wait()
    assert log.synchronize()
    assert x.tolist() == [9.0] * 4  # twice summed over 3 mirrored ranks
    assert log.calls() == [] and log.buffers() == []
    log.record_calls(True)
    calls = run(pg, log, lambda pg: pg.allreduce([x], options(AllreduceOptions)))
    assert "ncclAllReduce(count=4, ncclFloat32, ncclSum, C0, S1)" in calls


def test_events_are_pooled_and_the_internal_stream_made_once():
    pg, log = recorded_group()
    x = torch.ones(4)
    # The group lets go of finished Works when the next op is launched, before that op takes
    # its events: after the first op's two events and stream, no op makes anything (each has
    # run on the GPU by the next one's launch here).
    made = []
    for _ in range(6):
        calls = run(pg, log, lambda pg: pg.allreduce([x], options(AllreduceOptions)))
        assert log.synchronize()
        made.append(sum(c.startswith(("cudaEventCreate", "cudaStreamCreate")) for c in calls))
        assert [c for c in calls if c.startswith("ncclAllReduce")] == [
            "ncclAllReduce(count=4, ncclFloat32, ncclSum, C0, S1)"
        ]
    assert made == [3, 0, 0, 0, 0, 0]


def test_high_priority_internal_streams_on_request():
    pg, log = recorded_group(high_priority_streams=True)
    calls = run(pg, log, lambda pg: pg.allreduce([torch.ones(1)], options(AllreduceOptions)))
    assert "cudaStreamCreateWithPriority(high) -> S1" in calls


def premul(factor):
    return dist._make_nccl_premul_sum(factor)


def coalesced(*calls):
    def issue(pg):
        pg._start_coalescing()
        for call in calls:
            call(pg)
        return pg._end_coalescing()

    return issue


# (name, call(pg, async_op), NCCL calls with {s} for the op's stream). Tensors are float32
# unless named; ops that only move data move bytes (ncclUint8).
OPS = [
    (
        "all_reduce sum",
        lambda pg, a: pg.allreduce([torch.ones(4)], options(AllreduceOptions, a)),
        ["ncclAllReduce(count=4, ncclFloat32, ncclSum, C0, {s})"],
    ),
    (
        "all_reduce avg float16",
        lambda pg, a: pg.allreduce(
            [torch.ones(4, dtype=torch.float16)],
            options(AllreduceOptions, a, reduceOp=dist.ReduceOp.AVG),
        ),
        ["ncclAllReduce(count=4, ncclFloat16, ncclAvg, C0, {s})"],
    ),
    (
        "all_reduce product uint8",
        lambda pg, a: pg.allreduce(
            [torch.ones(4, dtype=torch.uint8)],
            options(AllreduceOptions, a, reduceOp=dist.ReduceOp.PRODUCT),
        ),
        ["ncclAllReduce(count=4, ncclUint8, ncclProd, C0, {s})"],
    ),
    (
        "all_reduce min int64",
        lambda pg, a: pg.allreduce(
            [torch.ones(3, dtype=torch.int64)],
            options(AllreduceOptions, a, reduceOp=dist.ReduceOp.MIN),
        ),
        ["ncclAllReduce(count=3, ncclInt64, ncclMin, C0, {s})"],
    ),
    (
        "all_reduce max bfloat16",
        lambda pg, a: pg.allreduce(
            [torch.ones(4, dtype=torch.bfloat16)],
            options(AllreduceOptions, a, reduceOp=dist.ReduceOp.MAX),
        ),
        ["ncclAllReduce(count=4, ncclBfloat16, ncclMax, C0, {s})"],
    ),
    (
        "all_reduce sum float8_e5m2",
        lambda pg, a: pg.allreduce(
            [torch.zeros(4, dtype=torch.float8_e5m2)], options(AllreduceOptions, a)
        ),
        ["ncclAllReduce(count=4, ncclFloat8e5m2, ncclSum, C0, {s})"],
    ),
    (
        "all_reduce sum bool is a max of bytes",
        lambda pg, a: pg.allreduce([torch.ones(5, dtype=torch.bool)], options(AllreduceOptions, a)),
        ["ncclAllReduce(count=5, ncclUint8, ncclMax, C0, {s})"],
    ),
    (
        "all_reduce sum complex64 as real view",
        lambda pg, a: pg.allreduce(
            [torch.ones(3, dtype=torch.complex64)], options(AllreduceOptions, a)
        ),
        ["ncclAllReduce(count=6, ncclFloat32, ncclSum, C0, {s})"],
    ),
    (
        "all_reduce premul_sum float64 scalar",
        lambda pg, a: pg.allreduce(
            [torch.ones(3, dtype=torch.float64)],
            options(AllreduceOptions, a, reduceOp=premul(0.5)),
        ),
        [
            "ncclRedOpCreatePreMulSum(scalar=0.5, ncclFloat64, C0) -> R0",
            "ncclAllReduce(count=3, ncclFloat64, R0, C0, {s})",
            "ncclRedOpDestroy(R0, C0)",
        ],
    ),
    (
        "all_reduce premul_sum complex is multiply then sum",
        lambda pg, a: pg.allreduce(
            [torch.ones(3, dtype=torch.complex64)],
            options(AllreduceOptions, a, reduceOp=premul(0.5)),
        ),
        ["ncclAllReduce(count=6, ncclFloat32, ncclSum, C0, {s})"],
    ),
    (
        "broadcast from rank 1",
        lambda pg, a: pg.broadcast([torch.ones(5)], options(BroadcastOptions, a, rootRank=1)),
        ["ncclBroadcast(count=20, ncclUint8, root=1, C0, {s})"],
    ),
    (
        "reduce max to rank 2",
        lambda pg, a: pg.reduce(
            [torch.ones(4)],
            options(ReduceOptions, a, rootRank=2, reduceOp=dist.ReduceOp.MAX),
        ),
        ["ncclReduce(count=4, ncclFloat32, ncclMax, root=2, C0, {s})"],
    ),
    (
        "reduce premul_sum to rank 0",
        lambda pg, a: pg.reduce(
            [torch.ones(4)], options(ReduceOptions, a, rootRank=0, reduceOp=premul(2.0))
        ),
        [
            "ncclRedOpCreatePreMulSum(scalar=2, ncclFloat32, C0) -> R0",
            "ncclReduce(count=4, ncclFloat32, R0, root=0, C0, {s})",
            "ncclRedOpDestroy(R0, C0)",
        ],
    ),
    (
        "all_gather list",
        lambda pg, a: pg.allgather(
            [[torch.empty(2) for _ in range(SIZE)]], [torch.ones(2)], options(AllgatherOptions, a)
        ),
        ["ncclAllGather(sendcount=8, ncclUint8, C0, {s})"],
    ),
    (
        "all_gather_into_tensor",
        lambda pg, a: pg._allgather_base(
            torch.empty(2 * SIZE), torch.ones(2), options(AllgatherOptions, a)
        ),
        ["ncclAllGather(sendcount=8, ncclUint8, C0, {s})"],
    ),
    (
        "reduce_scatter list",
        lambda pg, a: pg.reduce_scatter(
            [torch.empty(2)],
            [[torch.ones(2) for _ in range(SIZE)]],
            options(ReduceScatterOptions, a),
        ),
        ["ncclReduceScatter(recvcount=2, ncclFloat32, ncclSum, C0, {s})"],
    ),
    (
        "reduce_scatter_tensor avg",
        lambda pg, a: pg._reduce_scatter_base(
            torch.empty(2),
            torch.ones(2 * SIZE),
            options(ReduceScatterOptions, a, reduceOp=dist.ReduceOp.AVG),
        ),
        ["ncclReduceScatter(recvcount=2, ncclFloat32, ncclAvg, C0, {s})"],
    ),
    (
        "gather to rank 0",
        lambda pg, a: pg.gather(
            [[torch.empty(2) for _ in range(SIZE)]],
            [torch.ones(2)],
            options(GatherOptions, a, rootRank=0),
        ),
        [
            "ncclGroupStart()",
            "ncclRecv(count=8, ncclUint8, peer=1, C0, {s})",
            "ncclRecv(count=8, ncclUint8, peer=2, C0, {s})",
            "ncclGroupEnd()",
        ],
    ),
    (
        "gather to rank 1",
        lambda pg, a: pg.gather([], [torch.ones(2)], options(GatherOptions, a, rootRank=1)),
        ["ncclGroupStart()", "ncclSend(count=8, ncclUint8, peer=1, C0, {s})", "ncclGroupEnd()"],
    ),
    (
        "scatter from rank 0",
        lambda pg, a: pg.scatter(
            [torch.empty(2)],
            [[torch.ones(2) for _ in range(SIZE)]],
            options(ScatterOptions, a, rootRank=0),
        ),
        [
            "ncclGroupStart()",
            "ncclSend(count=8, ncclUint8, peer=1, C0, {s})",
            "ncclSend(count=8, ncclUint8, peer=2, C0, {s})",
            "ncclGroupEnd()",
        ],
    ),
    (
        "scatter from rank 2",
        lambda pg, a: pg.scatter([torch.empty(2)], [], options(ScatterOptions, a, rootRank=2)),
        ["ncclGroupStart()", "ncclRecv(count=8, ncclUint8, peer=2, C0, {s})", "ncclGroupEnd()"],
    ),
    (
        "all_to_all_single without splits: one ncclAlltoAll (NCCL 2.28+)",
        lambda pg, a: pg.alltoall_base(
            torch.empty(3, 2), torch.ones(3, 2), [], [], options(AllToAllOptions, a)
        ),
        ["ncclAlltoAll(count=8, ncclUint8, C0, {s})"],
    ),
    (
        "all_to_all_single with equal splits given: sends and recvs, as every rank may not",
        lambda pg, a: pg.alltoall_base(
            torch.empty(3, 2), torch.ones(3, 2), [1, 1, 1], [1, 1, 1], options(AllToAllOptions, a)
        ),
        EXCHANGE_8_BYTES_WITH_EACH_PEER,
    ),
    (
        "all_to_all_single uneven, empty blocks skipped",
        # Rows of 8 bytes; sends [1, 0, 2] rows, receives [1, 3, 0] rows.
        lambda pg, a: pg.alltoall_base(
            torch.empty(4, 2), torch.ones(3, 2), [1, 3, 0], [1, 0, 2], options(AllToAllOptions, a)
        ),
        [
            "ncclGroupStart()",
            "ncclRecv(count=24, ncclUint8, peer=1, C0, {s})",
            "ncclSend(count=16, ncclUint8, peer=2, C0, {s})",
            "ncclGroupEnd()",
        ],
    ),
    (
        "all_to_all list",
        lambda pg, a: pg.alltoall(
            [torch.empty(2) for _ in range(SIZE)],
            [torch.ones(2) for _ in range(SIZE)],
            options(AllToAllOptions, a),
        ),
        EXCHANGE_8_BYTES_WITH_EACH_PEER,
    ),
]

# Ops that are always async: one group on the internal stream, one Work.
ALWAYS_ASYNC = [
    (
        "all_reduce_coalesced",
        lambda pg: pg.allreduce_coalesced(
            [torch.ones(2), torch.ones(3)], options(AllreduceCoalescedOptions)
        ),
        [
            "ncclGroupStart()",
            "ncclAllReduce(count=2, ncclFloat32, ncclSum, C0, S1)",
            "ncclAllReduce(count=3, ncclFloat32, ncclSum, C0, S1)",
            "ncclGroupEnd()",
        ],
    ),
    (
        "all_gather_coalesced",
        lambda pg: pg.allgather_coalesced(
            [[torch.empty(2), torch.empty(1)] for _ in range(SIZE)],
            [torch.ones(2), torch.ones(1)],
            options(AllgatherOptions),
        ),
        [
            "ncclGroupStart()",
            "ncclAllGather(sendcount=8, ncclUint8, C0, S1)",
            "ncclAllGather(sendcount=4, ncclUint8, C0, S1)",
            "ncclGroupEnd()",
        ],
    ),
    (
        "all_gather_into_tensor coalesced",
        coalesced(
            lambda pg: pg._allgather_base(torch.empty(6), torch.ones(2), options(AllgatherOptions)),
            lambda pg: pg._allgather_base(torch.empty(3), torch.ones(1), options(AllgatherOptions)),
        ),
        [
            "ncclGroupStart()",
            "ncclAllGather(sendcount=8, ncclUint8, C0, S1)",
            "ncclAllGather(sendcount=4, ncclUint8, C0, S1)",
            "ncclGroupEnd()",
        ],
    ),
    (
        "reduce_scatter_tensor coalesced",
        coalesced(
            lambda pg: pg._reduce_scatter_base(
                torch.empty(2), torch.ones(6), options(ReduceScatterOptions)
            ),
            lambda pg: pg._reduce_scatter_base(
                torch.empty(1), torch.ones(3), options(ReduceScatterOptions)
            ),
        ),
        [
            "ncclGroupStart()",
            "ncclReduceScatter(recvcount=2, ncclFloat32, ncclSum, C0, S1)",
            "ncclReduceScatter(recvcount=1, ncclFloat32, ncclSum, C0, S1)",
            "ncclGroupEnd()",
        ],
    ),
    (
        "batch_isend_irecv",
        coalesced(
            lambda pg: pg.send([torch.ones(3)], 2, 0),
            lambda pg: pg.recv([torch.empty(3)], 1, 0),
        ),
        [
            "ncclGroupStart()",
            "ncclSend(count=12, ncclUint8, peer=2, C0, S1)",
            "ncclRecv(count=12, ncclUint8, peer=1, C0, S1)",
            "ncclGroupEnd()",
        ],
    ),
    (
        "barrier",
        lambda pg: pg.barrier(BarrierOptions()),
        ["ncclAllReduce(count=1, ncclFloat32, ncclSum, C0, S1)"],
    ),
]


def async_sequence(nccl_calls):
    """What the first async op of a group calls: the contract around its NCCL calls."""
    return [
        *INIT,
        "cudaStreamCreateWithPriority(low) -> S1",
        "cudaEventCreate() -> E1",
        "cudaEventRecord(E1, S0)",
        "cudaStreamWaitEvent(S1, E1)",
        *nccl_calls,
        "cudaEventCreate() -> E2",
        "cudaEventRecord(E2, S1)",
        "cudaStreamWaitEvent(S0, E2)",
    ]


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("call", "nccl_calls"), [op[1:] for op in OPS], ids=[op[0] for op in OPS])
def test_every_op_makes_exactly_these_calls(call, nccl_calls, async_op):
    pg, log = recorded_group()
    calls = run(pg, log, lambda pg: call(pg, async_op))
    if async_op:
        assert calls == async_sequence([c.format(s="S1") for c in nccl_calls])
    else:
        assert calls == [*INIT, *(c.format(s="S0") for c in nccl_calls), *SYNC_END]


@pytest.mark.parametrize(
    ("call", "nccl_calls"), [op[1:] for op in ALWAYS_ASYNC], ids=[op[0] for op in ALWAYS_ASYNC]
)
def test_grouped_ops_are_one_nccl_group_and_one_work(call, nccl_calls):
    pg, log = recorded_group()
    assert run(pg, log, call) == async_sequence(nccl_calls)


def in_order(calls, *expected):
    """`expected` appear in `calls` in this order (other calls may come between)."""
    positions = [calls.index(call) for call in expected]
    return positions == sorted(positions)


def after_both_lanes_connect(log):
    """The log once both lanes of a pair have connected: an op on one lane completes as soon as
    that lane has, while the other may still be connecting."""
    deadline = time.monotonic() + 10
    while sum(c.startswith("ncclCommInitRank") for c in log.calls()) < 2:
        assert time.monotonic() < deadline, "the lanes did not connect"
        time.sleep(0.01)
    return log.calls()


def test_send_and_recv_run_on_a_lane_per_peer_and_direction():
    pg, log = recorded_group()
    run(pg, log, lambda pg: pg.send([torch.ones(3)], 1, 0))
    send = after_both_lanes_connect(log)
    # Both directions' two-rank communicators connect in the background, each on a thread of
    # its own, so their calls come in either order. This rank is the lower of the pair: it
    # makes both unique ids.
    inits = sorted(c for c in send if c.startswith(("ncclGetUniqueId", "ncclCommInitRank")))
    assert [c.rsplit(" -> ", 1)[0] for c in inits] == [
        "ncclCommInitRank(nranks=2, rank=0, nonblocking)",  # 0 -> 1: this rank sends
        "ncclCommInitRank(nranks=2, rank=1, nonblocking)",  # 1 -> 0: this rank receives
        "ncclGetUniqueId()",
        "ncclGetUniqueId()",
    ]
    sending, receiving = (c.rsplit(" -> ", 1)[1] for c in inits[:2])
    lane = [c for c in send if c not in inits]
    assert sorted(lane) == sorted([
        "cudaStreamCreateWithPriority(low) -> S1",
        "cudaEventCreate() -> E1",
        "cudaEventRecord(E1, S0)",
        "cudaStreamWaitEvent(S1, E1)",
        f"ncclSend(count=12, ncclUint8, peer=1, {sending}, S1)",
        "cudaEventCreate() -> E2",
        "cudaEventRecord(E2, S1)",
        "cudaStreamWaitEvent(S0, E2)",
    ])  # fmt: skip
    # On the lane's stream, in the contract's order (the stream's work may wait until the
    # lane has connected, so the host's own calls can come between).
    assert in_order(
        lane,
        "cudaEventRecord(E1, S0)",
        "cudaStreamWaitEvent(S1, E1)",
        f"ncclSend(count=12, ncclUint8, peer=1, {sending}, S1)",
        "cudaEventRecord(E2, S1)",
        "cudaStreamWaitEvent(S0, E2)",
    )
    recv = run(pg, log, lambda pg: pg.recv([torch.empty(3)], 1, 0))
    assert [c for c in recv if not c.startswith(("cudaEvent", "cudaStreamWait"))] == [
        "cudaStreamCreateWithPriority(low) -> S2",  # the receiving lane's own stream
        f"ncclRecv(count=12, ncclUint8, peer=0, {receiving}, S2)",  # rank 1 is rank 0 of it
    ]
    # A second peer opens its own lanes; the group's communicator is never touched.
    run(pg, log, lambda pg: pg.send([torch.ones(1)], 2, 0))
    nccl = [c for c in after_both_lanes_connect(log) if c.startswith("nccl")]
    assert sorted(c.rsplit(" -> ", 1)[0] for c in nccl if "Init" in c) == [
        "ncclCommInitRank(nranks=2, rank=0, nonblocking)",
        "ncclCommInitRank(nranks=2, rank=1, nonblocking)",
    ]
    assert nccl.count("ncclGetUniqueId()") == 2
    (sent,) = [c for c in nccl if c.startswith("ncclSend")]
    assert sent.startswith("ncclSend(count=4, ncclUint8, peer=1, C") and sent.endswith(", S3)")
    assert sent not in (
        f"ncclSend(count=4, ncclUint8, peer=1, {name}, S3)" for name in ("C0", sending, receiving)
    )


def test_recv_from_any_source_is_refused_at_the_call():
    # NCCL has no receive from any source: a bad argument, and the group goes on.
    pg, log = recorded_group()
    with pytest.raises(ValueError, match="recvAnySource: cannot use cpu: NCCL cannot receive"):
        pg.recv_anysource([torch.empty(3)], 0)
    assert not any(c.startswith(("ncclRecv", "ncclCommInitRank")) for c in log.calls())
    x = torch.ones(4)
    run(pg, log, lambda pg: pg.allreduce([x], options(AllreduceOptions)))
    assert log.synchronize()
    assert torch.equal(x, torch.full((4,), 3.0))  # the sum over this rank and its 2 mirrors
    # Inside a group it is refused before any path is asked.
    pg._start_coalescing()
    with pytest.raises(ValueError, match="cannot join a coalesced group; name the sender"):
        pg.recv_anysource([torch.empty(3)], 0)
    pg._end_coalescing()


def test_destroying_the_group_finalizes_then_destroys_its_communicators():
    pg, log = recorded_group()
    run(pg, log, lambda pg: pg.allreduce([torch.ones(1)], options(AllreduceOptions)))
    run(pg, log, lambda pg: pg.send([torch.ones(1)], 1, 0))
    after_both_lanes_connect(log)
    log.clear()
    del pg
    calls = log.calls()
    assert sorted(calls) == [
        "cudaStreamDestroy(S1)",  # the group's internal stream and the lane's: ours to destroy
        "cudaStreamDestroy(S2)",
        "ncclCommDestroy(C0)",
        "ncclCommDestroy(C1)",
        "ncclCommDestroy(C2)",
        "ncclCommFinalize(C0)",  # non-blocking: polled until NCCL has flushed its work
        "ncclCommFinalize(C1)",
        "ncclCommFinalize(C2)",
    ]
    for comm in ("C0", "C1", "C2"):
        assert calls.index(f"ncclCommFinalize({comm})") < calls.index(f"ncclCommDestroy({comm})")


def test_eager_connect_opens_the_communicator_at_once():
    # torch calls it from init_process_group(device_id=...) for backends that split.
    pg, log = recorded_group()
    log.clear()
    pg.eager_connect_single_device(CPU)
    assert log.calls() == INIT
    calls = run(pg, log, lambda pg: pg.allreduce([torch.ones(2)], options(AllreduceOptions, False)))
    assert calls == ["ncclAllReduce(count=2, ncclFloat32, ncclSum, C0, S0)", *SYNC_END]


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_an_nccl_failure_names_rank_group_op_and_ncclGetLastError(async_op):
    pg, log = recorded_group()
    pg.eager_connect_single_device(CPU)
    log.fail_next("ncclAllReduce")
    with pytest.raises(dist.DistBackendError) as failure:
        work = pg.allreduce([torch.ones(4)], options(AllreduceOptions, async_op))
        work.wait()
    message = str(failure.value)
    assert message.startswith("[streamnccl rank 0/3 pg=")
    assert "] allreduce #1 ([4], Float): [streamnccl rank 0/3 cpu] ncclAllReduce failed" in message
    assert "(injected failure of ncclAllReduce)" in message  # what ncclGetLastError said
    # The group is broken: the next op raises at once, with the original cause.
    log.clear()
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure") as later:
        pg.allreduce([torch.ones(2)], options(AllreduceOptions, False))
    assert "injected failure of ncclAllReduce" in str(later.value)
    assert log.calls() == []


def test_a_failed_connection_is_a_backend_error_that_breaks_the_group():
    pg, log = recorded_group()
    log.fail_next("ncclCommInitRank")
    with pytest.raises(dist.DistBackendError, match="allreduce: connecting cpu failed") as failure:
        pg.allreduce([torch.ones(4)], options(AllreduceOptions, False))
    assert "(injected failure of ncclCommInitRank)" in str(failure.value)
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
        pg.broadcast([torch.ones(4)], options(BroadcastOptions, False))


def test_the_watchdog_times_out_a_stuck_op_and_aborts_the_communicator():
    pg, log = recorded_group(timeout=timedelta(milliseconds=200))
    pg.eager_connect_single_device(CPU)
    log.hold_events(True)  # the op never completes
    work = pg.allreduce([torch.ones(4)], options(AllreduceOptions))
    time.sleep(1.0)  # the watchdog looks every 50 ms
    assert "ncclCommAbort(C0)" in log.calls()
    with pytest.raises(dist.DistBackendError, match=r"allreduce #1 \(\[4\], Float\): timed out"):
        work.wait()
    with pytest.raises(dist.DistBackendError, match="unusable since an earlier failure"):
        pg.allreduce([torch.ones(4)], options(AllreduceOptions))
    log.clear()
    del pg
    assert "ncclCommDestroy(C0)" not in log.calls(), "an aborted communicator is not destroyed"


def test_a_launch_queries_one_running_op_per_stream_however_many_are_queued():
    # Ops on one stream end in launch order. A launch that queried every op in flight (as each
    # did before) costs more with each op queued: a loop of async ops faster than the stream
    # runs them is quadratic. Past an op still running, the ops after it on its stream are not
    # looked at; ops on other streams still are (test_point_to_point: ops behind a pending recv).
    pg, gpu = recorded_group()
    pg.eager_connect_single_device(CPU)
    gpu.hold_events(True)
    works = [pg.allreduce([torch.ones(4)], options(AllreduceOptions)) for _ in range(50)]
    before = gpu.queries_of_thread()
    works.append(pg.allreduce([torch.ones(4)], options(AllreduceOptions)))
    assert gpu.queries_of_thread() - before == 1  # the oldest, on the internal stream S1
    # A sync op, on the caller's stream S0, behind the 51 on S1: the look skips the 50 behind
    # the oldest on S1, and stops at the one on S0, the last stream with ops in flight.
    works.append(pg.allreduce([torch.ones(4)], options(AllreduceOptions, False)))
    before = gpu.queries_of_thread()
    works.append(pg.allreduce([torch.ones(4)], options(AllreduceOptions)))
    assert gpu.queries_of_thread() - before == 2
    gpu.hold_events(False)
    assert gpu.synchronize()  # wait() only orders the caller's stream after each op
    assert all(work.is_completed() for work in works)


def test_an_asynchronous_nccl_error_breaks_the_group():
    pg, log = recorded_group()
    pg.eager_connect_single_device(CPU)
    log.hold_events(True)
    work = pg.allreduce([torch.ones(4)], options(AllreduceOptions))
    log.fail_next("ncclCommGetAsyncError")
    time.sleep(1.0)
    assert "ncclCommAbort(C0)" in log.calls()
    with pytest.raises(dist.DistBackendError, match="injected asynchronous error"):
        work.wait()
    with pytest.raises(dist.DistBackendError, match="asynchronous NCCL error"):
        pg.broadcast([torch.ones(4)], options(BroadcastOptions))
    log.hold_events(False)  # the aborted op passes its end: the group's end need not wait it out


def test_abort_returns_at_once_and_fails_what_is_in_flight():
    pg, log = recorded_group()
    pg.eager_connect_single_device(CPU)
    log.hold_events(True)
    works = [pg.allreduce([torch.ones(4)], options(AllreduceOptions)) for _ in range(5)]
    log.clear()
    started = time.monotonic()
    pg.abort()
    assert time.monotonic() - started < 1
    assert log.calls() == ["ncclCommAbort(C0)"]
    for work in works:
        with pytest.raises(
            dist.DistBackendError, match="the group broke: .* aborted by the caller"
        ):
            work.wait()
    with pytest.raises(dist.DistBackendError, match="aborted by the caller"):
        pg.allreduce([torch.ones(4)], options(AllreduceOptions))
    log.hold_events(False)  # the aborted ops pass their end: the group's end need not wait


def test_the_watchdog_times_out_a_stuck_sync_op_too():
    # A sync op returns once enqueued; if it never completes on the caller's stream, the
    # watchdog still sees its end event pass the deadline.
    pg, log = recorded_group(timeout=timedelta(milliseconds=200))
    pg.eager_connect_single_device(CPU)
    log.hold_events(True)
    pg.allreduce([torch.ones(4)], options(AllreduceOptions, False)).wait()  # returns at once
    time.sleep(1.0)
    assert "ncclCommAbort(C0)" in log.calls()
    with pytest.raises(dist.DistBackendError, match=r"allreduce #1 \(\[4\], Float\): timed out"):
        pg.allreduce([torch.ones(4)], options(AllreduceOptions, False))


def test_the_groups_nccl_config_and_name_reach_every_communicator_it_makes():
    # Every communicator is made with the group's settings and named after the group, so that
    # NCCL_DEBUG=INFO lines say which group; lanes say which pair and direction.
    config = streamnccl.NcclConfig(
        cga_cluster_size=2, min_ctas=4, max_ctas=8, net_name="Socket", split_share=False
    )
    pg, log = _testing.recording_process_group(
        dist.HashStore(), 0, SIZE, timedelta(seconds=10), config=config, group_name="trainer"
    )
    settings = "cgaClusterSize=2, minCTAs=4, maxCTAs=8, netName=Socket, splitShare=0"
    calls = run(pg, log, lambda pg: pg.allreduce([torch.ones(4)], options(AllreduceOptions)))
    assert calls[1] == (
        f"ncclCommInitRank(nranks=3, rank=0, nonblocking, config{{{settings}, commName=trainer}})"
        " -> C0"
    )
    run(pg, log, lambda pg: pg.send([torch.ones(3)], 1, 0))
    inits = sorted(c.rsplit(" -> ", 1)[0] for c in after_both_lanes_connect(log) if "Init" in c)
    assert inits == [
        f"ncclCommInitRank(nranks=2, rank=0, nonblocking, config{{{settings}, "
        "commName=trainer lane 0->1})",
        f"ncclCommInitRank(nranks=2, rank=1, nonblocking, config{{{settings}, "
        "commName=trainer lane 1->0})",
    ]
    pg.shutdown()


def test_a_minimum_of_ctas_alone_comes_with_nccls_maximum():
    # NCCL compares minCTAs with maxCTAs before filling in its defaults, where an unset maximum
    # is the lowest int: a minimum alone would be refused at every init.
    pg, log = _testing.recording_process_group(
        dist.HashStore(), 0, SIZE, timedelta(seconds=10),
        config=streamnccl.NcclConfig(min_ctas=4),
    )  # fmt: skip
    calls = run(pg, log, lambda pg: pg.allreduce([torch.ones(4)], options(AllreduceOptions)))
    assert (
        calls[1]
        == "ncclCommInitRank(nranks=3, rank=0, nonblocking, config{minCTAs=4, maxCTAs=64}) -> C0"
    )
    pg.shutdown()


def test_a_subgroup_makes_its_communicators_with_its_own_config():
    # split_group's pg_options are the subgroup's: its NCCL config, not its parent's.
    pg, log = _testing.recording_process_group(
        dist.HashStore(), 0, SIZE, timedelta(seconds=10),
        config=streamnccl.NcclConfig(max_ctas=4), group_name="trainer",
    )  # fmt: skip
    own = streamnccl.Options(config=streamnccl.NcclConfig(max_ctas=8))
    own._timeout = timedelta(seconds=10)
    child = pg._split(dist.HashStore(), [0, 1], own)
    calls = run(child, log, lambda g: g.allreduce([torch.ones(4)], options(AllreduceOptions)))
    assert calls[1] == (
        "ncclCommInitRank(nranks=2, rank=0, nonblocking, config{maxCTAs=8, "
        "commName=trainer subgroup}) -> C0"
    )
    child.shutdown()
    pg.shutdown()


def test_a_config_nccl_refuses_fails_the_init_with_nccls_reason():
    # Options refuse these at init_process_group; the fake refuses them as NCCL would, should
    # one get through (here the recording group takes the config unchecked).
    pg, log = _testing.recording_process_group(
        dist.HashStore(), 0, SIZE, timedelta(seconds=10),
        config=streamnccl.NcclConfig(min_ctas=8, max_ctas=4),
    )  # fmt: skip
    with pytest.raises(dist.DistBackendError, match="invalid argument"):
        pg.allreduce([torch.ones(4)], options(AllreduceOptions)).wait()
    assert any("NCCL refuses the config (minCTAs/maxCTAs 8/4)" in c for c in log.calls())
