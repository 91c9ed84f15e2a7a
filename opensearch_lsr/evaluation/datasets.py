"""BEIR-layout datasets: ``corpus.jsonl``, ``queries[.<split>].jsonl``, ``qrels/<split>.tsv``."""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..corpus import doc_text

__all__ = ["BeirDataset", "load_beir", "cap_corpus", "holdout_query_ids", "HOLDOUT_FILE"]

#: Written next to a model trained on a BEIR split: the query ids it never saw (``lsr-os tune-hybrid`` tunes on them).
HOLDOUT_FILE = "holdout_queries.json"


@dataclass
class BeirDataset:
    """An evaluation split: corpus ``{doc_id: text}``, queries ``{qid: text}``, qrels ``{qid: {doc_id: rel}}``."""

    name: str
    split: str
    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)

    def only(self, query_ids) -> "BeirDataset":
        """These judged queries (unknown or unjudged ids raise), whole corpus."""
        ids = list(dict.fromkeys(str(q) for q in query_ids))
        missing = [q for q in ids if q not in self.qrels or q not in self.queries]
        if missing:
            raise ValueError(f"{len(missing)} of the {len(ids)} query ids are not judged queries of "
                             f"{self.name}/{self.split} (first: {missing[0]!r})")
        return BeirDataset(self.name, self.split, self.corpus, {q: self.queries[q] for q in ids},
                           {q: self.qrels[q] for q in ids})

    def subset(self, max_queries: int | None) -> "BeirDataset":
        """The first ``max_queries`` judged queries (file order), whole corpus."""
        if not max_queries:
            return self
        qids = [q for q in self.queries if q in self.qrels][:max_queries]
        return BeirDataset(self.name, self.split, self.corpus, {q: self.queries[q] for q in qids},
                           {q: self.qrels[q] for q in qids})


def holdout_query_ids(query_ids, n: int, seed: int = 42) -> list[str]:
    """``n`` query ids drawn with ``seed`` from ``query_ids`` (sorted first, so file order does not matter).

    The same (ids, n, seed) always give the same queries: ``lsr-os train --holdout-queries`` leaves them out of
    training, and ``lsr-os tune-hybrid`` tunes on them, for a model that did not train on queries too.
    """
    import random

    ordered = sorted(set(query_ids))
    if n <= 0:
        return []
    if n > len(ordered):
        raise ValueError(f"cannot hold out {n} queries of {len(ordered)}")
    return sorted(random.Random(seed).sample(ordered, n))


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from err
    return rows


def load_beir(directory: str | Path, split: str = "dev") -> BeirDataset:
    """Load a BEIR-layout dataset split; only judged queries of ``split`` are kept."""
    root = Path(directory)
    if not (root / "corpus.jsonl").exists():
        raise FileNotFoundError(f"{root} is not a BEIR dataset (no corpus.jsonl)")
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.exists():
        raise FileNotFoundError(f"no qrels for split {split!r} in {root / 'qrels'}")
    corpus = {str(r["_id"]): doc_text(r) for r in _read_jsonl(root / "corpus.jsonl")}
    qfile = root / f"queries.{split}.jsonl"
    if not qfile.exists():
        qfile = root / "queries.jsonl"
    queries_all = {str(r["_id"]): r["text"] for r in _read_jsonl(qfile)}
    qrels: dict[str, dict[str, int]] = {}
    with open(qrels_path, encoding="utf-8") as fh:
        reader = csv.reader(fh, delimiter="\t")
        header = next(reader, None)
        if header and header[0] != "query-id":  # headerless file: first row is data
            reader = iter([header, *reader])
        for row in reader:
            if len(row) < 3:
                continue
            qid, did, score = row[0], row[1], int(float(row[2]))
            if score > 0:
                qrels.setdefault(qid, {})[did] = score
    queries = {q: t for q, t in queries_all.items() if q in qrels}
    return BeirDataset(root.name, split, corpus, queries, qrels)


def cap_corpus(dataset: BeirDataset, max_docs: int | None) -> BeirDataset:
    """Keep every judged document of the kept queries, then others in file order up to ``max_docs``."""
    if not max_docs or len(dataset.corpus) <= max_docs:
        return dataset
    judged = [d for q in dataset.qrels for d in dataset.qrels[q] if d in dataset.corpus]
    keep = dict.fromkeys(judged)
    for did in dataset.corpus:
        if len(keep) >= max_docs:
            break
        keep.setdefault(did, None)
    corpus = {d: dataset.corpus[d] for d in dataset.corpus if d in keep}
    return BeirDataset(dataset.name, dataset.split, corpus, dataset.queries, dataset.qrels)
