"""Evaluation reports: JSON + Markdown summaries and per-query TREC run files."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import write_json

__all__ = ["DEFAULT_COLUMNS", "write_trec_run", "read_trec_run", "markdown_table", "write_report"]

#: Columns of the summary tables, in order (missing values print as "-").
DEFAULT_COLUMNS = ("mrr@10", "ndcg@10", "recall@100", "flops", "query_active_dims", "doc_active_dims")


def write_trec_run(run: Mapping[str, Mapping[str, float]], path: str | os.PathLike, tag: str = "lsr-os") -> Path:
    """TREC run format: ``qid Q0 docid rank score tag``, ranks from 1 by descending score."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = tag.replace(" ", "_") or "lsr-os"
    with open(out, "w", encoding="utf-8") as fh:
        for qid, docs in run.items():
            ranked = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))
            for rank, (did, score) in enumerate(ranked, 1):
                fh.write(f"{qid} Q0 {did} {rank} {score:.6f} {tag}\n")
    return out


def read_trec_run(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 5:
                run.setdefault(parts[0], {})[parts[2]] = float(parts[4])
    return run


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = DEFAULT_COLUMNS,
                   first: str = "system") -> str:
    """A GitHub Markdown table: one row per mapping, ``first`` column then ``columns``."""
    head = [first, *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(columns)) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c)) for c in head) + " |")
    return "\n".join(lines) + "\n"


def write_report(result: Mapping[str, Any], out_dir: str | os.PathLike, title: str = "Evaluation") -> tuple[Path, Path]:
    """Write ``report.json`` (everything) and ``report.md`` (summary + sweep tables) into ``out_dir``.

    ``result`` holds ``metrics`` (a row) or ``rows`` (several systems, e.g. the nori BM25 baseline first),
    optional ``sweep`` (rows with ``max_ratio``) and
    ``config`` / timing facts.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "report.json", dict(result))
    lines = [f"# {title}", ""]
    cfg = result.get("config") or {}
    for key in ("dataset", "split", "model", "backend", "query_mode", "n_queries", "n_docs"):
        value = cfg.get(key, result.get(key))
        if value is not None:
            lines.append(f"- **{key}**: `{value}`")
    rows = result.get("rows") or [{"system": result.get("name", "model"), **result["metrics"]}]
    columns = DEFAULT_COLUMNS + (("query_ms",) if any("query_ms" in r for r in rows) else ())
    lines += ["", "## Metrics", "", markdown_table(rows, columns)]
    if result.get("sweep"):
        lines += ["## Pruning sweep (document-side max_ratio)", "",
                  markdown_table(result["sweep"], DEFAULT_COLUMNS, first="max_ratio")]
    if result.get("plot"):
        lines += ["", f"![effectiveness vs FLOPS]({Path(result['plot']).name})", ""]
    if result.get("timings"):
        lines += ["## Timings (s)", ""] + [f"- {k}: {v:.2f}" for k, v in result["timings"].items()] + [""]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return out / "report.json", out / "report.md"
