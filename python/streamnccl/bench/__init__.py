"""nccl-tests style measurements of streamnccl against a baseline backend, in one run.

Run it under torchrun (one process per rank)::

    torchrun --nproc-per-node 2 -m streamnccl.bench --op all_reduce -b 1K -e 16M -f 4

Modules, one concern each: ``cli`` (arguments and message sizes), ``collectives`` (the ops,
their byte conventions and bus-bandwidth factors), ``check`` (inputs and their closed-form
results), ``timing`` (the timed loop), ``sweep`` (both backends, interleaved per size),
``report`` (the table and JSON) and ``plot``.
"""
