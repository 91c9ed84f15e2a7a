"""IR metrics through ranx (an established, tested implementation; nothing hand-rolled)."""
from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DEFAULT_METRICS", "evaluate_run"]

#: Report names -> ranx metric names.
DEFAULT_METRICS = {"mrr@10": "mrr@10", "ndcg@10": "ndcg@10", "recall@100": "recall@100"}


def evaluate_run(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    metrics: Mapping[str, str] = DEFAULT_METRICS,
) -> dict[str, float]:
    """Mean metrics over the judged queries; a query with no retrieved document scores 0."""
    from ranx import Qrels, Run, evaluate

    qrels = {q: dict(d) for q, d in qrels.items() if d}
    # ranx ignores queries absent from the run; give them an empty-but-valid entry so they count as 0.
    full_run = {q: (dict(run[q]) if run.get(q) else {"__none__": 0.0}) for q in qrels}
    scores = evaluate(Qrels(qrels), Run(full_run), list(metrics.values()), make_comparable=True)
    if len(metrics) == 1:
        scores = {next(iter(metrics.values())): scores}
    return {name: float(scores[m]) for name, m in metrics.items()}
