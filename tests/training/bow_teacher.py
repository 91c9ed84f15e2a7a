"""A deterministic bag-of-words stand-in for a dense teacher, shared by the teacher and adapt tests."""
from __future__ import annotations

import numpy as np
import pytest

VOCAB = ["house", "city", "cat", "dog", "capital", "france", "seoul", "korea", "water", "river", "car", "road",
         "book", "school", "paris", "the", "a", "is", "of"]


class BagOfWordsTeacher:
    """A deterministic stand-in for a dense bi-encoder: unit bag-of-words vectors (plus a tiny offset so
    no text is all-zero); cosine ranks documents by shared words."""

    def __init__(self, prompt: str = "passage") -> None:
        self.prompt = prompt

    def embed(self, texts, desc: str = "") -> np.ndarray:
        mat = np.full((len(texts), len(VOCAB)), 1e-3, dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.split():
                if word in VOCAB:
                    mat[i, VOCAB.index(word)] += 1.0
        return mat / np.linalg.norm(mat, axis=1, keepdims=True)


@pytest.fixture
def bow_teacher(monkeypatch):
    import opensearch_lsr.transfer.bridge as bridge

    calls = []

    def fake_get_bridge(spec, prompt="passage", use_cache=True):
        calls.append((spec, prompt))
        return BagOfWordsTeacher(prompt)

    monkeypatch.setattr(bridge, "get_bridge", fake_get_bridge)
    return calls
