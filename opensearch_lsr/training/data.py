"""Training pairs from a BEIR-layout dataset or a JSONL file, with bad rows reported as ``file:line``.

Output: a ``datasets.Dataset`` with columns ``query``, ``positive``, optional ``negative`` (or
``negative_1`` ... ``negative_n``) and optional ``label`` (teacher scores), the column order that
sentence-transformers' retrieval losses expect (anchor, positive, negatives..., label).

JSONL rows: ``{"query": str, "positive": str, "negative"?: str | [str, ...],
"score"?: float (teacher margin s(q, pos) - s(q, neg)), "scores"?: [s(q, pos), s(q, neg_1), ...]}``.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LsrError

__all__ = ["TrainingDataError", "TrainingData", "load_training_data", "hold_out", "read_jsonl_pairs", "read_beir_pairs",
           "mine_bm25_negatives"]

logger = logging.getLogger(__name__)

#: How many bad rows an error message lists before "... and N more".
_MAX_LISTED = 5


class TrainingDataError(LsrError, ValueError):
    """Bad training input; the message names the file and line of each bad row."""


@dataclass
class TrainingData:
    """Training rows plus what is known about them (for the config and the summary)."""

    rows: list[dict[str, Any]]
    source: str
    kind: str  # "beir" | "jsonl"
    label_kind: str | None = None  # None | "margin" | "scores"
    num_negatives: int = 0
    skipped: list[str] = field(default_factory=list)
    corpus: dict[str, str] | None = None  # BEIR input: the corpus (for IDF and hard negatives)
    holdout: list[str] = field(default_factory=list)  # BEIR input: query ids left out of training

    def to_dataset(self):
        """A ``datasets.Dataset`` in the column order the sentence-transformers losses expect."""
        from datasets import Dataset

        columns: dict[str, list] = {"query": [r["query"] for r in self.rows],
                                    "positive": [r["positive"] for r in self.rows]}
        for i in range(self.num_negatives):
            name = "negative" if self.num_negatives == 1 else f"negative_{i + 1}"
            columns[name] = [r["negatives"][i] for r in self.rows]
        if self.label_kind is not None:
            columns["label"] = [r["label"] for r in self.rows]
        return Dataset.from_dict(columns)


def _raise_bad(bad: list[str], what: str) -> None:
    listed = "; ".join(bad[:_MAX_LISTED])
    more = f" (and {len(bad) - _MAX_LISTED} more)" if len(bad) > _MAX_LISTED else ""
    raise TrainingDataError(f"{len(bad)} bad {what}: {listed}{more}")


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def _parse_jsonl_row(obj: Any) -> dict[str, Any]:
    """Validate one JSONL row; raise ``ValueError`` with the reason."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("query", "positive"):
        if key not in obj:
            raise ValueError(f"missing {key!r}")
        if not _is_text(obj[key]):
            raise ValueError(f"{key!r} must be a non-empty string")
    negatives = obj.get("negative", obj.get("negatives"))
    if negatives is None:
        negatives = []
    elif isinstance(negatives, str):
        negatives = [negatives]
    if not isinstance(negatives, list) or not all(_is_text(n) for n in negatives):
        raise ValueError("'negative' must be a non-empty string or a list of them")
    label = None
    label_kind = None
    if "score" in obj and obj["score"] is not None:
        if not _is_number(obj["score"]):
            raise ValueError("'score' must be a number (teacher margin s(q,pos) - s(q,neg))")
        if len(negatives) != 1:
            raise ValueError("'score' (a margin) needs exactly one negative")
        label, label_kind = float(obj["score"]), "margin"
    if "scores" in obj and obj["scores"] is not None:
        scores = obj["scores"]
        if label_kind is not None:
            raise ValueError("give 'score' or 'scores', not both")
        if not isinstance(scores, list) or not all(_is_number(s) for s in scores):
            raise ValueError("'scores' must be a list of numbers [s(q,pos), s(q,neg_1), ...]")
        if len(scores) != 1 + len(negatives) or not negatives:
            raise ValueError(f"'scores' needs 1 + number of negatives = {1 + len(negatives)} values "
                             f"(and at least one negative), got {len(scores)}")
        label, label_kind = [float(s) for s in scores], "scores"
    return {"query": obj["query"].strip(), "positive": obj["positive"].strip(),
            "negatives": [n.strip() for n in negatives], "label": label, "label_kind": label_kind}


def read_jsonl_pairs(path: str | os.PathLike, skip_bad_rows: bool = False) -> TrainingData:
    """Read (query, positive[, negative, score(s)]) rows; every row must have the same shape.

    Raises:
        TrainingDataError: listing ``file:line: reason`` for bad rows (unless ``skip_bad_rows``,
            which logs and drops them), or when no valid row remains.
    """
    path = Path(path)
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    shape: tuple[int, str | None] | None = None
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                bad.append(f"{where}: invalid JSON ({err.msg})")
                continue
            try:
                row = _parse_jsonl_row(obj)
            except ValueError as err:
                bad.append(f"{where}: {err}")
                continue
            row_shape = (len(row["negatives"]), row["label_kind"])
            if shape is None:
                shape = row_shape
            elif row_shape != shape:
                bad.append(f"{where}: has {row_shape[0]} negative(s) and label {row_shape[1]!r}, but the first "
                           f"row has {shape[0]} and {shape[1]!r} (all rows need the same shape)")
                continue
            rows.append(row)
    if bad and not skip_bad_rows:
        _raise_bad(bad, f"row(s) in {path}")
    for msg in bad:
        logger.warning("skipped %s", msg)
    if not rows:
        raise TrainingDataError(f"{path} holds no valid training row")
    num_neg, label_kind = shape  # type: ignore[misc]
    return TrainingData(rows=rows, source=str(path), kind="jsonl", label_kind=label_kind,
                        num_negatives=num_neg, skipped=bad)


def _split_queries_file(root: Path, split: str) -> Path:
    qfile = root / f"queries.{split}.jsonl"
    if not qfile.exists():
        qfile = root / "queries.jsonl"
    if not qfile.exists():
        raise TrainingDataError(f"no queries file in {root} (queries.{split}.jsonl or queries.jsonl)")
    return qfile


def _translated_queries(source: str | os.PathLike, split: str) -> tuple[dict[str, str], str]:
    """Query texts by id from a parallel BEIR copy (its ``split`` queries) or a queries file."""
    from ..evaluation.crosslingual import CrossLingualError, read_queries_file

    path = Path(source)
    if path.is_dir():
        from ..evaluation.datasets import _read_jsonl

        qfile = _split_queries_file(path, split)
        try:
            return {str(r["_id"]): r.get("text", "") for r in _read_jsonl(qfile)}, qfile.name
        except (ValueError, KeyError) as err:
            raise TrainingDataError(f"{qfile}: {err}") from err
    try:
        return read_queries_file(path), path.name
    except CrossLingualError as err:
        raise TrainingDataError(str(err)) from err


def read_beir_pairs(directory: str | os.PathLike, split: str = "train",
                    skip_bad_rows: bool = False, queries_from: str | os.PathLike | None = None) -> TrainingData:
    """One (query, positive) row per judged-relevant qrel of ``split``.

    The qrels file is checked line by line: unknown query or corpus ids, missing columns and
    non-numeric scores are reported as ``qrels/<split>.tsv:<line>: reason``.

    ``queries_from``: translate-train (SPLADE-X (b), Nair et al. 2022): the query texts come from a
    parallel BEIR copy (its ``queries.<split>.jsonl``, same query ids; e.g. the English originals of a
    machine-translated Korean set) or a queries file, the positives from ``directory``'s corpus. Texts
    are looked up by the ids of ``split``'s qrels only, so no other split's query can enter training.
    """
    from ..corpus import doc_text
    from ..evaluation.datasets import _read_jsonl

    root = Path(directory)
    if not (root / "corpus.jsonl").exists():
        raise TrainingDataError(f"{root} is not a BEIR dataset (no corpus.jsonl)")
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.exists():
        raise TrainingDataError(f"no qrels for split {split!r} in {root / 'qrels'}")
    qfile = _split_queries_file(root, split)
    try:
        corpus = {str(r["_id"]): doc_text(r) for r in _read_jsonl(root / "corpus.jsonl")}
        queries = {str(r["_id"]): r.get("text", "") for r in _read_jsonl(qfile)}
    except (ValueError, KeyError) as err:
        raise TrainingDataError(f"{root}: {err}") from err
    if queries_from is not None:
        queries, qname = _translated_queries(queries_from, split)
        qfile = Path(queries_from) / qname if Path(queries_from).is_dir() else Path(queries_from)
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    seen: set[tuple[str, str]] = set()
    with open(qrels_path, encoding="utf-8") as fh:
        for lineno, fields in enumerate(csv.reader(fh, delimiter="\t"), 1):
            if not fields or (lineno == 1 and fields[0] == "query-id"):
                continue
            where = f"{qrels_path}:{lineno}"
            if len(fields) < 3:
                bad.append(f"{where}: expected query-id, corpus-id, score (got {len(fields)} column(s))")
                continue
            qid, did, score = fields[0], fields[1], fields[2]
            try:
                relevance = float(score)
            except ValueError:
                bad.append(f"{where}: score {score!r} is not a number")
                continue
            if relevance <= 0:
                continue
            if qid not in queries:
                bad.append(f"{where}: query id {qid!r} is not in {qfile if queries_from is not None else qfile.name}")
                continue
            if did not in corpus:
                bad.append(f"{where}: corpus id {did!r} is not in corpus.jsonl")
                continue
            if not _is_text(queries[qid]) or not _is_text(corpus[did]):
                bad.append(f"{where}: empty query or document text")
                continue
            if (qid, did) in seen:
                continue
            seen.add((qid, did))
            rows.append({"query": queries[qid].strip(), "positive": corpus[did], "negatives": [],
                         "label": None, "label_kind": None, "qid": qid, "did": did})
    if bad and not skip_bad_rows:
        _raise_bad(bad, f"qrels row(s) in {qrels_path}")
    for msg in bad:
        logger.warning("skipped %s", msg)
    if not rows:
        raise TrainingDataError(f"{qrels_path} gives no (query, positive) pair")
    return TrainingData(rows=rows, source=str(root), kind="beir", skipped=bad, corpus=corpus)


def mine_bm25_negatives(data: TrainingData, tokenizer, top_k: int = 10, seed: int = 42) -> TrainingData:
    """Add one hard negative per BEIR pair: a random non-relevant document of BM25's top ``top_k``
    (``bm25s`` over the encoder's own WordPiece tokens, so any language works)."""
    if data.corpus is None:
        raise TrainingDataError("BM25 hard negatives need a BEIR dataset (the corpus to mine from)")
    try:
        import bm25s
    except ImportError as err:  # pragma: no cover - dev extra
        raise TrainingDataError("hard negatives need `pip install bm25s`") from err
    import numpy as np

    doc_ids = list(data.corpus)
    vocab_docs = tokenizer([data.corpus[d] for d in doc_ids], add_special_tokens=False)["input_ids"]
    retriever = bm25s.BM25()
    retriever.index([[str(t) for t in ids] for ids in vocab_docs], show_progress=False)
    positives: dict[str, set[str]] = {}
    for row in data.rows:
        positives.setdefault(row["qid"], set()).add(row["did"])
    q_tokens = tokenizer([r["query"] for r in data.rows], add_special_tokens=False)["input_ids"]
    k = min(top_k + 5, len(doc_ids))
    results, _ = retriever.retrieve([[str(t) for t in ids] for ids in q_tokens], k=k, show_progress=False)
    rng = random.Random(seed)
    rows = []
    for row, hits in zip(data.rows, np.asarray(results)):
        cands = [doc_ids[h] for h in hits if doc_ids[h] not in positives[row["qid"]]][:top_k]
        if not cands:  # nothing but positives retrieved: a random document
            cands = [d for d in rng.sample(doc_ids, min(20, len(doc_ids))) if d not in positives[row["qid"]]][:1]
        if not cands:
            continue
        rows.append({**row, "negatives": [data.corpus[rng.choice(cands)]]})
    return TrainingData(rows=rows, source=data.source, kind=data.kind, num_negatives=1,
                        skipped=data.skipped, corpus=data.corpus, holdout=data.holdout)


def hold_out(data: TrainingData, n: int, seed: int = 42) -> TrainingData:
    """Drop every row of ``n`` held-out queries (:func:`~opensearch_lsr.evaluation.datasets.holdout_query_ids`)
    and record them in ``data.holdout``; a split with fewer than ``2 n`` queries keeps all of them (warning)."""
    from ..evaluation.datasets import holdout_query_ids

    qids = {r["qid"] for r in data.rows if "qid" in r}
    if n <= 0 or not qids:
        return data
    if len(qids) < 2 * n:
        logger.warning("the split has %d queries, fewer than twice the %d to hold out: none held out", len(qids), n)
        return data
    held = holdout_query_ids(qids, n, seed)
    drop = set(held)
    data.rows = [r for r in data.rows if r["qid"] not in drop]
    data.holdout = held
    return data


def load_training_data(source: str | os.PathLike, split: str = "train", skip_bad_rows: bool = False,
                       max_pairs: int = 0, queries_from: str | os.PathLike | None = None,
                       holdout: int = 0, seed: int = 42) -> TrainingData:
    """BEIR directory or JSONL file -> :class:`TrainingData` (first ``max_pairs`` rows if > 0);
    ``queries_from`` (BEIR input only): query texts of a parallel copy (translate-train, :func:`read_beir_pairs`);
    ``holdout`` (BEIR input only): queries left out of training (:func:`hold_out`)."""
    path = Path(source)
    if path.is_dir():
        data = hold_out(read_beir_pairs(path, split, skip_bad_rows, queries_from=queries_from), holdout, seed)
    elif queries_from is not None:
        raise TrainingDataError("--queries-from / --query-language replace the queries of a BEIR dataset; "
                                f"{str(source)!r} is not a BEIR directory")
    elif path.is_file():
        data = read_jsonl_pairs(path, skip_bad_rows)
    else:
        raise TrainingDataError(f"dataset {str(source)!r} does not exist (expected a BEIR directory or a JSONL file)")
    if max_pairs > 0:
        data.rows = data.rows[:max_pairs]
    return data
