"""Figures of tuning and benchmark results: tuning curves, the cross-budget heatmap, per-task bars.

Each function returns a matplotlib `Figure` (shown inline by Jupyter) and, given `path`, also saves it;
the suffix picks the format (`.png`, `.svg`, `.pdf`). Figures are built without pyplot, so nothing here
touches a global backend or needs a display.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value >= 100 else f"{value:.3g} ms"


def _cores(n: int) -> str:
    return f"{n} core" if n == 1 else f"{n} cores"


def _tuned_at(result) -> str:
    """A BudgetResult's legend label."""
    return f"tuned at {result.budget} ({_cores(len(result.cores))})"


def _log_y(ax) -> None:
    """Make the y axis logarithmic, labelled in plain numbers (0.2, 6, 10 rather than 2e-01, 6x10^0): every
    minor tick within a decade of data, those at 2 and 5 over more. Call after plotting."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    every = high / low < 10

    def minor(value, _):
        lead = round(value / 10 ** math.floor(math.log10(value)))
        return f"{value:g}" if every or lead in (2, 5) else ""

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def _finish(fig, path: str | os.PathLike | None):
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _budget_results(report) -> list:
    """The BudgetResults of a TuneReport, or of an iterable of them."""
    return list(report.budgets if hasattr(report, "budgets") else report)


def _store_lines(source, model: str | None) -> list[tuple[str, list[tuple[float, float]]]]:
    """(label, [(records so far, estimated ms)]) per budget, from the store's records in the order measured."""
    from resaware.store import Slot, Store

    if isinstance(source, Store):
        from resaware.platform import hardware

        here = hardware.detect().id
        slots = [s for s in source.slots() if s.hardware.id == here] or source.slots()
        labels = [f"{s.kind} {s.fraction:.0%} ({s.key})" for s in slots]
    else:
        slots = [Slot.open(r.slot) for r in _budget_results(source)]
        labels = [_tuned_at(r) for r in _budget_results(source)]
        model = model or getattr(source, "model", None)
    return [(label, [(n, est * 1e3) for n, est in slot.curve(model) if est is not None])
            for label, slot in zip(labels, slots)]  # fmt: skip


def tuning_curves(source, path: str | os.PathLike | None = None, x: str = "trials", model: str | None = None):
    """Estimated model latency (sum of weight x best task latency) as tuning went on, one line per budget.

    `source` is a `TuneReport` or a `Store`. With `x="trials"` the curves are read from the store, record by
    record in the order they were measured (so they span every run that tuned the budget); `model` picks a
    model when a budget holds tasks of several. With `x="seconds"` (reports only) they are this run's, after
    every batch. A curve starts once every task has a valid record; a budget that never got that far is
    named in the legend without a line.
    """
    if x not in ("trials", "seconds"):
        raise ValueError(f"x must be 'trials' or 'seconds', got {x!r}")
    if x == "trials":
        lines = _store_lines(source, model)
    elif hasattr(source, "budgets"):
        lines = [(_tuned_at(r), [(s, est * 1e3) for s, _, est in r.history if est is not None])
                 for r in source.budgets]  # fmt: skip
    else:
        raise ValueError("x='seconds' needs a TuneReport: a store keeps the order of its records, not their times")
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    for i, (label, points) in enumerate(lines):
        colour = _PALETTE[i % len(_PALETTE)]
        if not points:
            ax.plot([], [], color=colour, label=f"{label}: not every task measured yet")
            continue
        xs, ms = zip(*points)
        ax.step(xs, ms, where="post", color=colour, label=f"{label}: {ms[-1]:.3g} ms")
        ax.plot(xs[-1], ms[-1], "o", color=colour, markersize=4)
    _log_y(ax)
    ax.set_xlim(left=0)
    ax.text(0.01, 0.02, "a curve starts once every kernel has a measured schedule", transform=ax.transAxes,
            fontsize=7, color="grey")  # fmt: skip
    ax.set_xlabel("records in the store (measured candidates)" if x == "trials" else "seconds of tuning")
    ax.set_ylabel("estimated latency (ms)")
    name = model or getattr(source, "model", "")
    ax.set_title(f"{name} tuning curves: best schedules so far, weighted by use".strip(), fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _finish(fig, path)


def task_bars(report, path: str | os.PathLike | None = None, top: int = 12):
    """Each task's best latency times its weight (ms per inference), one bar per budget of a `TuneReport`,
    for the `top` tasks that cost most; tasks with no valid record have no bar."""
    results = _budget_results(report)
    cost: dict[str, float] = {}
    for result in results:
        for t in result.tasks:
            if t.best_s is not None:
                cost[t.name] = max(cost.get(t.name, 0.0), t.weight * t.best_s * 1e3)
    names = sorted(cost, key=lambda n: -cost[n])[:top]
    fig = _figure(max(6.0, 0.75 * len(names) + 2), 4.8)
    ax = fig.add_subplot()
    width = 0.8 / max(len(results), 1)
    for i, result in enumerate(results):
        by_name = {t.name: t for t in result.tasks}
        heights = [
            by_name[n].weight * by_name[n].best_s * 1e3 if n in by_name and by_name[n].best_s is not None else 0.0
            for n in names
        ]
        ax.bar([j + (i - (len(results) - 1) / 2) * width for j in range(len(names))], heights, width,
               color=_PALETTE[i % len(_PALETTE)], label=_tuned_at(result))  # fmt: skip
    ax.set_xticks(range(len(names)), [n if len(n) <= 28 else n[:27] + "…" for n in names], rotation=40,
                  ha="right", fontsize=7)  # fmt: skip
    _log_y(ax)
    ax.set_ylabel("weight x best latency (ms per inference)")
    ax.set_title(f"{getattr(report, 'model', '')} per task: where an inference spends its time".strip(), fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y", which="both")
    return _finish(fig, path)


def heatmap(matrix, path: str | os.PathLike | None = None):
    """A `CrossBudget` matrix as a heatmap: colour is the ratio to the column's best tuned module (log scale,
    green best); each cell shows its median latency and ratio, the best tuned module of a column in bold."""
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ratios = [[matrix.cell(row, b).ratio for b in matrix.run_at] for row in matrix.rows]
    top = max(max(r) for r in ratios)
    low = min(min(r) for r in ratios)
    fig = _figure(2.6 + 1.9 * len(matrix.run_at), 1.5 + 0.65 * len(matrix.rows))
    ax = fig.add_subplot()
    image = ax.imshow(ratios, cmap="RdYlGn_r", norm=LogNorm(vmin=min(low, 1 / 1.5), vmax=max(top, 1.5)), aspect="auto")
    ax.set_xticks(range(len(matrix.run_at)), [f"run at {b}\n({_cores(matrix.cores[b])})" for b in matrix.run_at])
    ax.set_yticks(range(len(matrix.rows)), matrix.rows)
    for i, row in enumerate(matrix.rows):
        for j, budget in enumerate(matrix.run_at):
            cell = matrix.cell(row, budget)
            bold = row.startswith("tuned@") and math.isclose(cell.ratio, 1.0)
            r, g, b, _ = image.cmap(image.norm(cell.ratio))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # light text on the deep reds and greens
            ax.text(j, i, f"{_ms(cell.median_ms)}\n{cell.ratio:.2f}x", ha="center", va="center", fontsize=9,
                    color="white" if dark else "black", fontweight="bold" if bold else "normal")  # fmt: skip
    bar = fig.colorbar(image, ax=ax, label="latency / best tuned module in the column")
    lo, hi = image.norm.vmin, image.norm.vmax
    bar.set_ticks([t for t in (0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 10, 20, 50, 100) if lo <= t <= hi])
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    bar.ax.yaxis.set_minor_formatter(NullFormatter())
    title = f"{matrix.model}: tuned at (rows) x run at (columns)"
    if matrix.robust:
        title += f"; robust: tune at {matrix.robust}"
    ax.set_title(f"{title}\n{matrix.hardware}", fontsize=10)
    return _finish(fig, path)


def curves(series: dict[str, list[tuple[float, float]]], path: str | os.PathLike | None = None, title: str = "",
           lines: dict[str, float] | None = None, dotted: Iterable[str] = (), xlabel: str = "wall seconds"):  # fmt: skip
    """Latency (ms, log scale) against wall time, one step line per label of `series` (label -> points);
    labels in `dotted` are drawn thin and dotted in the colour of the line before; `lines` (label -> ms)
    are horizontal and dashed."""
    dotted = set(dotted)
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    colour = None
    for label, points in series.items():
        seconds, ms = zip(*points) if points else ((), ())
        if label in dotted:
            ax.step(seconds, ms, where="post", linestyle=":", linewidth=1, color=colour, label=label)
        else:
            (line,) = ax.step(seconds, ms, where="post", marker="o", markersize=4, label=label)
            colour = line.get_color()
    for (label, ms), style in zip((lines or {}).items(), itertools.cycle(("--", "-.", (0, (5, 2, 1, 2)), ":"))):
        ax.axhline(ms, color="grey", linestyle=style, linewidth=1, label=f"{label} ({ms:.3g} ms)")
    _log_y(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("latency (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return _finish(fig, path)
