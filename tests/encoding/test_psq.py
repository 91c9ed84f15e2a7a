"""PSQ query translation (SPLADE-X (a)) through a transfer's alignment, by hand on tiny vocabularies."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
from opensearch_lsr.encoding.psq import (PsqConfig, PsqError, PsqQueryEncoder, resolve_query_encoder,
                                         translation_matrix)


def test_translation_matrix_normalises_per_english_token():
    # alignment [V_t=3, V_s=3]: target 0 built from source 0 (0.6) and 1 (0.4); target 1 = source 0 (overlap,
    # one-hot); target 2 from source 1 only. Source 2 built nothing.
    a = sp.csr_matrix(np.array([[0.6, 0.4, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], np.float32))
    p = translation_matrix(a).toarray()  # [V_s, V_t]
    np.testing.assert_allclose(p[0], [0.6 / 1.6, 1.0 / 1.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(p[1], [0.4 / 1.4, 0.0, 1.0 / 1.4], rtol=1e-6)
    np.testing.assert_allclose(p[2], [0.0, 0.0, 0.0])
    # pruning below 0.3 drops P(t0|s1)=0.286 and renormalises the rest of that row
    pruned = translation_matrix(a, min_prob=0.3).toarray()
    np.testing.assert_allclose(pruned[1], [0.0, 0.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(pruned[0], p[0], rtol=1e-6)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        translation_matrix(a, min_prob=1.0)


@pytest.fixture()
def psq_model(tiny_source_dir, tiny_target_tokenizer_dir, tmp_path):
    """A 'transfer output' with a hand-written alignment: only its tokenizer, alignment.npz and config matter."""
    from transformers import AutoTokenizer

    src_tok = AutoTokenizer.from_pretrained(str(tiny_source_dir))
    model = tmp_path / "ko-model"
    shutil.copytree(tiny_target_tokenizer_dir, model)
    tgt_tok = AutoTokenizer.from_pretrained(str(model))
    s, t = src_tok.convert_tokens_to_ids, tgt_tok.convert_tokens_to_ids
    rows, cols, vals = [], [], []
    for target, parts in {"집": {"house": 0.7, "city": 0.3}, "house": {"house": 1.0}, "고양이": {"cat": 0.5, "cats": 0.5},
                          "서울": {"seoul": 0.8, "capital": 0.2}, "[CLS]": {"[CLS]": 1.0}}.items():
        for source, w in parts.items():
            rows.append(t(target))
            cols.append(s(source))
            vals.append(w)
    sp.save_npz(model / "alignment.npz", sp.csr_matrix((vals, (rows, cols)), shape=(len(tgt_tok), len(src_tok))))
    (model / "transfer_config.json").write_text(json.dumps({"source": str(tiny_source_dir)}))
    return model


def test_psq_query_is_the_english_vector_times_translation_probabilities(psq_model, tiny_source_dir):
    psq = PsqQueryEncoder(PsqConfig(str(psq_model)))
    english = SparseKeyedEncoder(str(tiny_source_dir))
    text = "house cat seoul"
    w = english.encode([text])[0]  # {english token: weight} by the source SPLADE
    got = psq(text)
    # P(집|house) = 0.7 / (0.7 + 1.0), P(house|house) = 1.0 / 1.7; P(집|city) = 1 (its only target)
    expected = {
        "집": w.get("house", 0) * 0.7 / 1.7 + w.get("city", 0) * 1.0,
        "house": w.get("house", 0) * 1.0 / 1.7,
        "고양이": w.get("cat", 0) + w.get("cats", 0),
        "서울": w.get("seoul", 0) + w.get("capital", 0),
    }
    expected = {k: v for k, v in expected.items() if v > 0}
    assert set(got) == set(expected) and expected
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5)
    # English weight that reached a translated token is conserved (untranslated tokens drop out)
    translated = {"house", "city", "cat", "cats", "seoul", "capital"}
    assert sum(got.values()) == pytest.approx(sum(v for k, v in w.items() if k in translated), rel=1e-5)
    assert "[CLS]" not in got
    ids = psq.encode([text], key_format="token_id")[0]
    assert len(ids) == len(got) and all(k.isdigit() for k in ids)


def test_psq_errors_and_auto_choice(psq_model, tiny_target_tokenizer_dir, splade_tiny_dir, tmp_path):
    with pytest.raises(PsqError, match="no alignment.npz"):
        PsqQueryEncoder(PsqConfig(str(tiny_target_tokenizer_dir)))
    with pytest.raises(PsqError, match="not the transfer's source"):
        PsqQueryEncoder(PsqConfig(str(psq_model), source="splade-tiny"))
    assert resolve_query_encoder(str(psq_model), "en") == "psq"
    assert resolve_query_encoder(str(psq_model), "ko") == "model"
    assert resolve_query_encoder(str(psq_model), None) == "model"
    assert resolve_query_encoder("splade-tiny", "en") == "model"
    assert resolve_query_encoder(str(psq_model), "en", "model") == "model"
    with pytest.raises(ValueError, match="auto, model, psq"):
        resolve_query_encoder(str(psq_model), "en", "translate")


@pytest.mark.slow
def test_eval_and_search_take_psq_queries(tiny_source_dir, tiny_target_tokenizer_dir, tmp_path):
    """A real (mean-init) transfer: `lsr-os eval --query-language en` picks PSQ, `search` sends its tokens."""
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli
    from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer

    model = sembridge_transfer(SemBridgeConfig(source=str(tiny_source_dir), init="mean", out=str(tmp_path / "m"),
                                               target_tokenizer=str(tiny_target_tokenizer_dir)))
    for lang, docs, queries in (("ko", {"ko-d0": "서울 house", "ko-d1": "고양이 cat"}, {"q1": "서울", "q2": "고양이"}),
                                ("en", {"en-d0": "seoul house", "en-d1": "cat"}, {"q1": "seoul house", "q2": "cat"})):
        root = tmp_path / f"mini-{lang}"
        (root / "qrels").mkdir(parents=True)
        (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": t}, ensure_ascii=False) + "\n"
                                                   for d, t in docs.items()), encoding="utf-8")
        (root / "queries.dev.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False) + "\n"
                                                        for q, t in queries.items()), encoding="utf-8")
        (root / "qrels" / "dev.tsv").write_text(f"q1\t{lang}-d0\t1\nq2\t{lang}-d1\t1\n", encoding="utf-8")
    runner = CliRunner()
    out = tmp_path / "eval"
    res = runner.invoke(cli, ["eval", "--dataset", str(tmp_path / "mini-ko"), "--model", str(model), "--out", str(out),
                              "--query-language", "en", "--prune-levels", ""])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    # a random tiny model ranks arbitrarily: only the query side is checked (its queries are the overlap tokens)
    assert report["config"]["query_side"] == "psq" and report["metrics"]["query_active_dims"] > 0
    res = runner.invoke(cli, ["search", "--index", str(out / "index"), "--model", str(model), "--query-language", "en",
                              "--show-query", "--json", "seoul house"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.output[res.output.index("{"):res.output.index("\n}") + 2])
    tokens = body["query"]["bool"]["should"][0]["neural_sparse"]["sparse_embedding"]["query_tokens"] \
        if "bool" in body["query"] else body["query"]["neural_sparse"]["sparse_embedding"]["query_tokens"]
    # a mean-init transfer aligns only the overlap tokens: PSQ can reach nothing else
    assert tokens and set(tokens) <= {"house", "cat", "seoul", "##s"}
