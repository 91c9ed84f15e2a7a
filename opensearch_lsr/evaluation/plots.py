"""Plots (matplotlib, headless ``Agg``): effectiveness against FLOPS over a pruning sweep."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["plot_effectiveness_vs_flops"]


def plot_effectiveness_vs_flops(
    series: Mapping[str, Sequence[Mapping[str, float]]],
    path: str | os.PathLike,
    metrics: Sequence[str] = ("ndcg@10", "mrr@10"),
    title: str | None = None,
) -> Path:
    """One line per (system, metric) through the sweep rows (``flops`` on x, log scale); each
    point labelled with its ``max_ratio``. ``series`` maps a system name to its sweep rows."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    markers = ["o", "s", "^", "D", "v", "P"]
    for s, (name, rows) in enumerate(series.items()):
        rows = sorted(rows, key=lambda r: r["flops"])
        for m, metric in enumerate(metrics):
            xs = [max(r["flops"], 1e-9) for r in rows]
            ys = [r[metric] for r in rows]
            ax.plot(xs, ys, marker=markers[(s + m) % len(markers)], linestyle="-" if m == 0 else "--",
                    label=f"{name} {metric}" if len(series) > 1 else metric)
            if m == 0:
                for r, x, y in zip(rows, xs, ys):
                    if "max_ratio" in r:
                        ax.annotate(f"{r['max_ratio']:g}", (x, y), textcoords="offset points", xytext=(3, 3),
                                    fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("FLOPS (expected shared active dims per query-document pair)")
    ax.set_ylabel("effectiveness")
    ax.set_title(title or "Effectiveness vs FLOPS (labels: document max_ratio pruning)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
