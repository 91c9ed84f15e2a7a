"""BEIR-layout datasets: ``corpus.jsonl``, ``queries[.<split>].jsonl``, ``qrels/<split>.tsv``."""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..corpus import doc_text

__all__ = ["BeirDataset", "load_beir", "cap_corpus"]


@dataclass
class BeirDataset:
    """An evaluation split: corpus ``{doc_id: text}``, queries ``{qid: text}``, qrels ``{qid: {doc_id: rel}}``."""

    name: str
    split: str
    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)

    def subset(self, max_queries: int | None) -> "BeirDataset":
        """The first ``max_queries`` judged queries (file order), whole corpus."""
        if not max_queries:
            return self
        qids = [q for q in self.queries if q in self.qrels][:max_queries]
        return BeirDataset(self.name, self.split, self.corpus, {q: self.queries[q] for q in qids},
                           {q: self.qrels[q] for q in qids})


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
