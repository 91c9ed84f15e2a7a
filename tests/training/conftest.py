"""Fixtures for training tests: a tiny BEIR dataset written by the test (words the tiny models know)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

TOPICS = [("house", "city"), ("cat", "dog"), ("capital", "france"), ("seoul", "korea"), ("water", "river"),
          ("car", "road"), ("book", "school"), ("paris", "capital"), ("dog", "road"), ("river", "city"),
          ("korea", "school"), ("france", "book")]


def write_beir(root: Path, n_queries: int = 24, seed: int = 0) -> Path:
    """A BEIR dataset: each query names two topic words; its positive repeats them among filler."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    corpus, queries = [], {"train": [], "dev": []}
    qrels = {"train": [], "dev": []}
    for i in range(n_queries):
        a, b = TOPICS[i % len(TOPICS)]
        did, qid = f"d{i}", f"q{i}"
        filler = rng.sample(["the", "a", "is", "of"], 2)
        corpus.append({"_id": did, "title": "", "text": f"{a} {filler[0]} {b} {filler[1]} {a}"})
        split = "dev" if i % 4 == 3 else "train"
        queries[split].append({"_id": qid, "text": f"{a} {b}"})
        qrels[split].append(f"{qid}\t{did}\t1")
    for i in range(8):  # distractors
        corpus.append({"_id": f"x{i}", "title": "", "text": " ".join(rng.sample(["the", "a", "is", "of", "car"], 3))})
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus), encoding="utf-8")
    for split in ("train", "dev"):
        (root / f"queries.{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries[split]),
                                                     encoding="utf-8")
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels[split]) + "\n",
                                                     encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def tiny_beir(tmp_path_factory) -> Path:
    return write_beir(tmp_path_factory.mktemp("tiny_beir"))


@pytest.fixture(scope="session")
def tiny_encoder_dir(tiny_source_dir, tmp_path_factory) -> Path:
    """The tiny random MLM saved as a SparseEncoder directory (what every step loads)."""
    from opensearch_lsr.transfer.surgery import load_source_model, save_sparse_encoder

    model, tok = load_source_model(str(tiny_source_dir))
    return save_sparse_encoder(model, tok, tmp_path_factory.mktemp("tiny_encoder"), max_seq_length=32)


@pytest.fixture(scope="session")
def beir_writer():
    """:func:`write_beir`, for tests that need datasets of their own size."""
    return write_beir
