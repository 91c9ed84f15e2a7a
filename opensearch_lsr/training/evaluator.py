"""Dev-split retrieval evaluation during training, through the toolkit's evaluation module.

A sentence-transformers evaluator (so ``SparseEncoderTrainer`` calls it on its schedule and logs
its metrics) that runs :func:`opensearch_lsr.evaluation.retrieval.evaluate_encoder`: the same exact
in-memory retrieval and ranx metrics as ``lsr-os eval``. A subset keeps it cheap on a CPU: the
first ``n`` judged queries, all their positives, and a seeded random sample of other documents as
distractors (figures on a subset are higher than on the whole corpus; compare like with like).
"""
from __future__ import annotations

import logging
import random
import time

from sentence_transformers.base.evaluation import BaseEvaluator

from ..evaluation.datasets import BeirDataset
from ..evaluation.retrieval import evaluate_encoder

__all__ = ["RetrievalDevEvaluator", "subset_dataset"]

logger = logging.getLogger(__name__)


def subset_dataset(dataset: BeirDataset, max_queries: int = 0, max_corpus: int = 0, seed: int = 42) -> BeirDataset:
    """First ``max_queries`` judged queries; their positives plus random documents up to ``max_corpus``.

    ``0`` keeps everything. The result is deterministic for a given ``seed``.
    """
    qids = sorted(dataset.queries)
    if max_queries and max_queries < len(qids):
        qids = random.Random(seed).sample(qids, max_queries)
    queries = {q: dataset.queries[q] for q in qids}
    qrels = {q: dataset.qrels[q] for q in qids}
    if max_corpus and max_corpus < len(dataset.corpus):
        keep = {d for q in qids for d in qrels[q] if d in dataset.corpus}
        others = sorted(set(dataset.corpus) - keep)
        extra = random.Random(seed).sample(others, max(0, min(len(others), max_corpus - len(keep))))
        ids = keep | set(extra)
        corpus = {d: t for d, t in dataset.corpus.items() if d in ids}
    else:
        corpus = dataset.corpus
    return BeirDataset(dataset.name, dataset.split, corpus, queries, qrels)


class RetrievalDevEvaluator(BaseEvaluator):
    """Evaluate a ``SparseEncoder`` on a BEIR split with :func:`evaluate_encoder` (MRR@10 primary).

    Args:
        dataset: the (possibly subset) dev split.
        name: metric prefix in the trainer's logs (``eval_<name>_mrr@10``).
        batch_size: encoding batch size.
    """

    def __init__(self, dataset: BeirDataset, name: str = "dev", batch_size: int = 32) -> None:
        super().__init__()
        self.dataset = dataset
        self.name = name
        self.batch_size = batch_size
        self.primary_metric = "mrr@10"
        self.history: list[dict[str, float]] = []

    def __call__(self, model, output_path: str | None = None, epoch: int = -1, steps: int = -1, *args, **kwargs):
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        try:
            metrics = evaluate_encoder(model, self.dataset, batch_size=self.batch_size)
        finally:
            model.train(was_training)
        metrics["eval_seconds"] = time.perf_counter() - start
        logger.info("dev eval at step %s: %s", steps, metrics)
        self.history.append({"step": steps, **metrics})
        return self.prefix_name_to_metrics(metrics, self.name)

    def get_config_dict(self) -> dict:
        return {"queries": len(self.dataset.queries), "corpus": len(self.dataset.corpus)}
