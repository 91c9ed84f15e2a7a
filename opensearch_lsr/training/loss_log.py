"""Loss log (JSONL, one line per trainer log event) and the PNG of the loss curves."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from transformers import TrainerCallback

__all__ = ["LossLogCallback", "read_loss_log", "plot_loss_curves"]


class LossLogCallback(TrainerCallback):
    """Append every trainer log event (``loss``, ``base_loss``, regularisers, ``eval_*``) to a JSONL file.

    On resume, entries after the checkpoint's step are dropped first, so the log has no duplicates.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._start = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()
        if self.path.exists() and state.global_step > 0:
            kept = [r for r in read_loss_log(self.path) if r.get("step", 0) <= state.global_step]
            with open(self.path, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
        elif self.path.exists() and state.global_step == 0:
            self.path.unlink()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        row = {"step": state.global_step, "epoch": state.epoch,
               "elapsed_s": round(time.perf_counter() - self._start, 2)}
        row.update({k: float(v) if isinstance(v, (int, float)) else v for k, v in logs.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_loss_log(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def plot_loss_curves(
    logs: Mapping[str, str | os.PathLike | Sequence[dict]],
    out_png: str | os.PathLike,
    keys: Sequence[str] = ("base_loss", "document_regularizer_loss", "query_regularizer_loss"),
    title: str = "training loss",
) -> Path:
    """Plot one panel per loss key, one line per run (``{label: loss_log.jsonl or rows}``); PNG via Agg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {label: read_loss_log(src) if isinstance(src, (str, os.PathLike)) else list(src)
            for label, src in logs.items()}
    present = [k for k in keys if any(k in r for rows in runs.values() for r in rows)]
    present = present or ["loss"]
    fig, axes = plt.subplots(1, len(present), figsize=(5 * len(present), 3.6), squeeze=False)
    for ax, key in zip(axes[0], present):
        values = []
        for label, rows in runs.items():
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                xs, ys = zip(*pts)
                values += ys
                ax.plot(xs, ys, label=label, marker="." if len(pts) < 40 else None)
        positive = [v for v in values if v > 0]
        if positive and max(positive) > 100 * min(positive):  # runs differing by orders of magnitude
            if len(positive) == len(values):
                ax.set_yscale("log")
            else:  # zeros (regulariser weights ramped from 0): linear near 0, log above
                ax.set_yscale("symlog", linthresh=min(positive))
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
