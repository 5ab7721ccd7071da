"""busbw and time against size, one line per backend and op (matplotlib, the `plot` extra)."""

from collections import defaultdict


def plot(path: str, results, backends: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window: ranks run headless
    import matplotlib.pyplot as plt

    lines = defaultdict(list)  # (op, backend) -> results by size
    for r in results:
        lines[(r.op, r.backend)].append(r)
    ops = list(dict.fromkeys(r.op for r in results))
    colors = {op: f"C{i % 10}" for i, op in enumerate(ops)}
    styles = {name: style for name, style in zip(backends, ("-", "--", ":"), strict=False)}

    figure, (busbw_axes, time_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (op, backend), points in lines.items():
        sizes = [r.bytes for r in points]
        style = dict(color=colors[op], linestyle=styles[backend], marker="o", markersize=3)
        label = f"{op} {backend}" if len(ops) > 1 else backend
        busbw_axes.plot(sizes, [r.busbw_gbps for r in points], label=label, **style)
        time_axes.plot(sizes, [r.time_us for r in points], label=label, **style)
    for axes, ylabel in ((busbw_axes, "busbw (GB/s)"), (time_axes, "time per op (us)")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("size (bytes)")
        axes.set_ylabel(ylabel)
        axes.grid(True, which="both", alpha=0.3)
    time_axes.set_yscale("log")
    busbw_axes.legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
