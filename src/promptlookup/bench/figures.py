"""The benchmark's figures (PNG, through matplotlib), drawn from summary rows."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

#: A fixed setting of the ``--sweep`` grid, e.g. ``promptlookup:k=8,min=2``.
SWEEP_NAME = re.compile(r"^promptlookup:k=(\d+),min=(\d+)$")


def headline_methods(summary: Sequence[dict]) -> list[str]:
    """The methods of ``summary`` in order, leaving out a sweep's grid when there are many
    methods (the grid has its own figure and table)."""
    methods = list(dict.fromkeys(r["method"] for r in summary))
    if len(methods) > 8:  # a sweep: its grid gets its own figure
        methods = [m for m in methods if not SWEEP_NAME.match(m)]
    return methods


def bar_figure(summary, key: str, ylabel: str, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in summary))
    methods = headline_methods(summary)
    values = {(r["task"], r["method"]): r[key] for r in summary}
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + len(tasks) * len(methods) * 0.35), 4.0))
    for j, method in enumerate(methods):
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(tasks))]
        ys = [values.get((t, method)) or 0.0 for t in tasks]
        ax.bar(xs, ys, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def sweep_figure(summary, path: Path) -> bool:
    """Heatmaps of speed-up over the sweep grid (rows min_match, columns k), one per task."""
    grid = {}
    for row in summary:
        match = SWEEP_NAME.match(row["method"])
        if match and row["speedup"] is not None:
            grid.setdefault(row["task"], {})[(int(match[2]), int(match[1]))] = row["speedup"]
    if not any(len(cells) > 1 for cells in grid.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(grid), figsize=(4.2 * len(grid), 3.4), squeeze=False)
    for ax, (task, cells) in zip(axes[0], grid.items()):
        mins = sorted({m for m, _ in cells})
        ks = sorted({k for _, k in cells})
        data = [[cells.get((m, k), float("nan")) for k in ks] for m in mins]
        image = ax.imshow(data, cmap="viridis", aspect="auto")
        for y, values in enumerate(data):
            for x, value in enumerate(values):
                ax.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white")
        ax.set_xticks(range(len(ks)), ks)
        ax.set_yticks(range(len(mins)), mins)
        ax.set_xlabel("k (draft tokens)")
        ax.set_ylabel("min match")
        ax.set_title(f"{task}: speed-up vs plain")
        fig.colorbar(image, ax=ax)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True
