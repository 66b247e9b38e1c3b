"""Figures for benchmark results (matplotlib, drawn off-screen)."""

from __future__ import annotations

import math
import os


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def heatmap(result, path: str | os.PathLike) -> str:
    """The cross-budget matrix as a heatmap: colour is the ratio to the column's best tuned module."""
    from matplotlib.colors import LogNorm

    plt = _pyplot()
    ratios = [[result.cell(row, b).ratio for b in result.run_at] for row in result.rows]
    top = max(max(r) for r in ratios)
    low = min(min(r) for r in ratios)
    fig, ax = plt.subplots(figsize=(2.2 + 1.9 * len(result.run_at), 1.2 + 0.6 * len(result.rows)))
    image = ax.imshow(ratios, cmap="RdYlGn_r", norm=LogNorm(vmin=min(low, 1 / 1.5), vmax=max(top, 1.5)), aspect="auto")
    ax.set_xticks(range(len(result.run_at)), [f"run at {b}\n({result.cores[b]} cores)" for b in result.run_at])
    ax.set_yticks(range(len(result.rows)), result.rows)
    for i, row in enumerate(result.rows):
        for j, budget in enumerate(result.run_at):
            cell = result.cell(row, budget)
            bold = row.startswith("tuned@") and math.isclose(cell.ratio, 1.0)
            ax.text(j, i, f"{cell.median_ms:.3g} ms\n{cell.ratio:.2f}x", ha="center", va="center", fontsize=8,
                    fontweight="bold" if bold else "normal")  # fmt: skip
    fig.colorbar(image, ax=ax, label="latency / best tuned in column")
    title = f"{result.model}: tuned-at x run-at"
    if result.robust:
        title += f" (robust: tune at {result.robust})"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return os.fspath(path)


def curves(series: dict[str, list[tuple[float, float]]], path: str | os.PathLike, title: str,
           target_ms: float | None = None, dotted=()) -> str:  # fmt: skip
    """Latency (ms, log scale) against wall seconds, one line per label (those in `dotted` thin and
    dotted, in the colour of the line before); `target_ms` dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colour = None
    for label, points in series.items():
        seconds, ms = zip(*points) if points else ((), ())
        if label in dotted:
            ax.step(seconds, ms, where="post", linestyle=":", linewidth=1, color=colour, label=label)
        else:
            (line,) = ax.step(seconds, ms, where="post", marker="o", markersize=4, label=label)
            colour = line.get_color()
    if target_ms:
        ax.axhline(target_ms, color="grey", linestyle="--", linewidth=1, label="best final + 5%")
    ax.set_yscale("log")
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return os.fspath(path)
