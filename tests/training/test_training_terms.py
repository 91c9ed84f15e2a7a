"""Held-out queries, the InfoNCE + KL loss, IDF-aware FLOPS, and adapt's prepared data moving between machines."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

from opensearch_lsr.evaluation.datasets import HOLDOUT_FILE, holdout_query_ids
from opensearch_lsr.training.data import hold_out, load_training_data, read_beir_pairs
from opensearch_lsr.training.losses import IdfFlopsLoss, idf_penalty_weights
from opensearch_lsr.training.pseudo_queries import PseudoQueryConfig

from test_adapt import _corpus_file
from bow_teacher import bow_teacher  # noqa: F401 - fixture


def test_holdout_is_a_seeded_draw_independent_of_order():
    ids = [f"q{i}" for i in range(100)]
    a = holdout_query_ids(ids, 10, seed=7)
    assert a == holdout_query_ids(list(reversed(ids)), 10, seed=7) and len(set(a)) == 10
    assert a != holdout_query_ids(ids, 10, seed=8)
    with pytest.raises(ValueError, match="cannot hold out"):
        holdout_query_ids(ids, 101)


def test_training_data_drops_every_row_of_held_out_queries(tmp_path, beir_writer):
    root = beir_writer(tmp_path / "b", n_queries=40)
    full = read_beir_pairs(root, "train")
    data = load_training_data(root, "train", holdout=5, seed=3)
    assert len(data.holdout) == 5 and not {r["qid"] for r in data.rows} & set(data.holdout)
    assert len(data.rows) == len(full.rows) - 5
    assert data.holdout == holdout_query_ids({r["qid"] for r in full.rows}, 5, 3)
    # fewer than twice the queries: nothing held out
    small = hold_out(read_beir_pairs(root, "train"), 20)
    assert small.holdout == [] and len(small.rows) == len(full.rows)


def test_idf_flops_weights_frequent_tokens_more():
    vocab = {"the": 0, "seoul": 1, "rare": 2, "absent": 3}
    p = idf_penalty_weights({"the": 0.2, "seoul": 2.0, "rare": 8.0}, vocab, 4)
    assert float(p.mean()) == pytest.approx(1.0)
    assert p[0] > p[3] > p[1] > p[2]  # 1/0.2 > 1/1 (missing key = idf 1) > 1/2 > 1/8
    emb = torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 0.0, 4.0, 0.0]])
    loss = IdfFlopsLoss(None, p).compute_loss_from_embeddings(emb)
    mean = emb.mean(0)
    assert float(loss) == pytest.approx(float((p * mean ** 2).sum()))
    # uniform IDF gives back the plain FLOPS of sentence-transformers
    from sentence_transformers.sparse_encoder.losses import FlopsLoss

    flat = IdfFlopsLoss(None, idf_penalty_weights({}, vocab, 4)).compute_loss_from_embeddings(emb)
    assert float(flat) == pytest.approx(float(FlopsLoss(None).compute_loss_from_embeddings(emb)))


def test_infonce_with_kl_adds_the_kl_term(tiny_encoder_dir):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder import losses

    from opensearch_lsr.training.losses import InfoNCEWithKL

    model = SparseEncoder(str(tiny_encoder_dir))
    g = torch.Generator().manual_seed(0)
    emb = [torch.rand(4, 30, generator=g) for _ in range(3)]  # query, positive, negative
    labels = torch.tensor([[3.0, 1.0]] * 4)
    combined = InfoNCEWithKL(model, kl_weight=0.5).compute_loss_from_embeddings(emb, labels)
    nce = losses.SparseMultipleNegativesRankingLoss(model).compute_loss_from_embeddings(emb, labels)
    kl = losses.SparseDistillKLDivLoss(model, temperature=1.0).compute_loss_from_embeddings(emb, labels)
    assert float(combined) == pytest.approx(float(nce + 0.5 * kl), rel=1e-5)
    with pytest.raises(ValueError, match="kl_weight"):
        InfoNCEWithKL(model, kl_weight=0.0)


def test_train_writes_holdout_and_trains_with_kl_and_idf_flops(tmp_path, tiny_encoder_dir, bow_teacher, beir_writer):
    from opensearch_lsr.training import TrainConfig, train

    root = beir_writer(tmp_path / "b", n_queries=48)
    out = tmp_path / "m"
    config = TrainConfig(model=str(tiny_encoder_dir), dataset=str(root), out=str(out), loss="infonce",
                         inference_free=True, teacher="fake", teacher_negatives=1, teacher_depth=6,
                         teacher_min_rank=1, kl_weight=0.2, idf_flops=True, holdout_queries=4, max_steps=2,
                         batch_size=4, max_seq_length=16, eval_split=None, final_eval=False, threads=1)
    result = train(config)
    held = json.loads((out / HOLDOUT_FILE).read_text())
    assert held["split"] == "train" and len(held["query_ids"]) == 4 and result.steps == 2
    assert result.pairs == 36 - 4  # 36 train queries, 4 held out
    with pytest.raises(ValueError, match="infonce"):
        replace(config, loss="kldiv").validate()
    with pytest.raises(ValueError, match="inference-free"):
        replace(config, inference_free=False).validate()


def test_adapt_prepared_elsewhere_trains_here_and_rescales_scores(tmp_path, tiny_encoder_dir, bow_teacher):
    pytest.importorskip("mecab_ko")
    from opensearch_lsr.training.adapt import AdaptConfig, adapt
    from opensearch_lsr.training.pseudo_queries import PseudoQueryConfig

    corpus = _corpus_file(tmp_path)
    first = tmp_path / "prep"
    config = AdaptConfig(model=str(tiny_encoder_dir), corpus=str(corpus), out=str(first), teacher="fake",
                         inference_free=True, consistency_rank=3, negatives=1, negative_depth=5,
                         queries=PseudoQueryConfig(per_passage=2), batch_size=4, epochs=1, save_steps=0,
                         max_seq_length=16, threads=1, teacher_temperature=0.05)
    prepared = adapt(config, prepare_only=True)
    assert prepared.train == {} and not (first / "modules.json").exists() and prepared.rows > 0
    # another machine: the corpus at another path, the work folder copied, the teacher absent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(corpus, elsewhere / "corpus.jsonl")
    shutil.copytree(first / "adapt_work", tmp_path / "run" / "adapt_work")
    bow_teacher.clear()
    moved = replace(config, corpus=str(elsewhere / "corpus.jsonl"), out=str(tmp_path / "run"), loss="kldiv",
                    teacher_temperature=0.01, document_regularizer_weight=3e-4)
    result = adapt(moved)
    assert bow_teacher == [] and result.rows == prepared.rows and result.train["steps"] >= 1
    rows = [json.loads(x) for x in (first / "adapt_work" / "pairs.jsonl").read_text().splitlines()]
    rescaled = [json.loads(x) for x in (tmp_path / "run" / "adapt_work" / "pairs.T0.01.jsonl").read_text().splitlines()]
    assert [s for r in rescaled for s in r["scores"]] == pytest.approx([s * 5 for r in rows for s in r["scores"]])
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["document_regularizer_weight"] == 3e-4 and saved["dataset"].endswith("pairs.T0.01.jsonl")


def test_average_models_is_the_weighted_mean(tmp_path, tiny_encoder_dir):
    from click.testing import CliRunner
    from safetensors.torch import load_file, save_file

    from opensearch_lsr.cli import cli

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(tiny_encoder_dir, a)
    shutil.copytree(tiny_encoder_dir, b)
    weights_file = next(b.rglob("*.safetensors"))
    tensors = load_file(str(weights_file))
    save_file({k: (v + 1.0 if v.is_floating_point() else v) for k, v in tensors.items()}, str(weights_file))
    res = CliRunner().invoke(cli, ["average-models", str(a), str(b), "--out", str(tmp_path / "soup"),
                                   "--weights", "3,1"])
    assert res.exit_code == 0, res.output
    rel = weights_file.relative_to(b)
    soup = load_file(str(tmp_path / "soup" / rel))
    first = load_file(str(a / rel))
    key = next(k for k, v in first.items() if v.is_floating_point())
    assert torch.allclose(soup[key], first[key] + 0.25, atol=1e-6)
    from sentence_transformers import SparseEncoder

    assert SparseEncoder(str(tmp_path / "soup")).encode_document(["seoul"]).shape[-1] > 0
    again = CliRunner().invoke(cli, ["average-models", str(a), "--out", str(tmp_path / "x")])
    assert again.exit_code != 0 and "at least two" in again.output


@pytest.mark.parametrize("scope", ["embeddings", "all"])
def test_continued_mlm_changes_only_its_scope(tmp_path, tiny_encoder_dir, scope):
    from safetensors.torch import load_file

    from opensearch_lsr.training.mlm import MlmConfig, continue_mlm

    texts = ["seoul is the capital of korea", "the river runs through the city", "a dog and a cat"] * 4
    facts = continue_mlm(str(tiny_encoder_dir), texts, tmp_path / "m", MlmConfig(epochs=2, scope=scope, batch_size=4,
                                                                                  lr=1e-2, max_seq_length=16))
    assert facts["steps"] == 6 and facts["first_loss"] > 0
    before = load_file(str(next(tiny_encoder_dir.rglob("model.safetensors"))))
    after = load_file(str(next((tmp_path / "m").rglob("model.safetensors"))))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any("word_embeddings" in k for k in changed)
    layers = {k for k in changed if ".layer." in k}
    assert (layers == set()) if scope == "embeddings" else layers
    assert json.loads((tmp_path / "m" / "mlm_config.json").read_text())["scope"] == scope


def test_mixed_teacher_ranks_by_the_min_max_mix():
    import numpy as np

    from opensearch_lsr.training.adapt import _mixed_teacher

    index_of = {f"d{i}": i for i in range(6)}
    sims = np.asarray([0.9, 0.8, 0.7, 0.1, 0.0, 0.5], np.float32)
    top = [0, 1, 2]
    bm25 = {"d2": 10.0, "d3": 5.0, "d0": 0.0}
    ranked, mixed = _mixed_teacher(top, {5}, sims.copy(), bm25, index_of, mix=0.5)
    # candidates 0,1,2,3,5: dense min-max over them (0.1..0.9), BM25 min-max over 2,3,0; d1 and d5 absent: 0
    dense = {0: 1.0, 1: 0.875, 2: 0.75, 3: 0.0, 5: 0.5}
    lex = {0: 0.0, 1: 0.0, 2: 1.0, 3: 0.5, 5: 0.0}
    want = {i: 0.5 * dense[i] + 0.5 * lex[i] for i in dense}
    assert ranked == sorted(want, key=lambda i: -want[i])[:3] == [2, 0, 1]
    assert mixed[4] == -np.inf and all(abs(mixed[i] - v) < 1e-6 for i, v in want.items())


def test_adapt_with_mlm_starts_training_from_the_mlm_model(tmp_path, tiny_encoder_dir, bow_teacher):
    pytest.importorskip("mecab_ko")
    from opensearch_lsr.training.adapt import AdaptConfig, adapt
    from opensearch_lsr.training.pseudo_queries import PseudoQueryConfig

    config = AdaptConfig(model=str(tiny_encoder_dir), corpus=str(_corpus_file(tmp_path)), out=str(tmp_path / "o"),
                         teacher="fake", inference_free=True, consistency_rank=3, negatives=1, negative_depth=5,
                         queries=PseudoQueryConfig(per_passage=2), batch_size=4, epochs=1, save_steps=0,
                         max_seq_length=16, threads=1, mlm_epochs=1, mlm_scope="embeddings")
    result = adapt(config)
    mlm_dir = tmp_path / "o" / "adapt_work" / "mlm_model"
    assert json.loads((mlm_dir / "mlm_config.json").read_text())["steps"] == 1  # 15 passages, batches of 32
    assert json.loads((tmp_path / "o" / "train_config.json").read_text())["model"] == str(mlm_dir)
    assert result.train["steps"] >= 1


def test_adapt_defaults_follow_the_measured_recipe(tmp_path, beir_writer):
    from opensearch_lsr.training.adapt import AdaptConfig

    corpus = str(_corpus_file(tmp_path))
    corpus_only = AdaptConfig(model="m", corpus=corpus, out="o", inference_free=True)
    corpus_only.validate()
    assert (corpus_only.loss, corpus_only.teacher_temperature, corpus_only.idf_flops) == ("kldiv", 0.0015, True)
    assert corpus_only.consistency_rank == 10  # more of the short question queries kept
    assert corpus_only.queries.per_passage == 6  # six pseudo-queries per passage: sparser documents
    root = beir_writer(tmp_path / "b")
    labelled = AdaptConfig(model="m", corpus=corpus, out="o", inference_free=True, labels=str(root))
    labelled.validate()
    assert labelled.loss == "infonce"
    recipe = ("negatives", "negative_depth", "negative_min_rank", "teacher_margin", "kl_weight", "query_lr")
    # denoised hard negatives + KL + learned IDF query weights
    assert tuple(getattr(labelled, k) for k in recipe) == (2, 50, 5, 0.05, 1.0, 0.1)
    assert labelled.consistency_rank == 3 and labelled.queries.per_passage == 3
    assert tuple(getattr(corpus_only, k) for k in recipe) == (1, 30, 0, 0.02, 0.0, 0.0)
    chosen = AdaptConfig(model="m", corpus=corpus, out="o", inference_free=True, labels=str(root), negatives=1,
                         kl_weight=0.0)
    chosen.validate()  # what a user sets stays set
    assert tuple(getattr(chosen, k) for k in recipe) == (1, 50, 5, 0.05, 0.0, 0.1)
    with_kl = AdaptConfig(model="m", corpus=corpus, out="o", inference_free=True, kl_weight=1.0)
    with_kl.validate()
    assert with_kl.loss == "infonce"
    bi = AdaptConfig(model="m", corpus=corpus, out="o")
    bi.validate()
    assert (bi.loss, bi.teacher_temperature, bi.idf_flops, bi.query_lr) == ("infonce", 0.01, False, 0.0)
    assert bi.consistency_rank == 3 and bi.queries.per_passage == 3
    three = AdaptConfig(model="m", corpus=corpus, out="o", inference_free=True, queries=PseudoQueryConfig(per_passage=3))
    three.validate()
    assert three.queries.per_passage == 3  # a count the user gives stays


def test_average_models_rewrites_the_idf_of_learned_query_weights(tmp_path, tiny_encoder_dir):
    from safetensors.torch import load_file, save_file

    from opensearch_lsr.inference_free import build_inference_free
    from opensearch_lsr.training.ensemble import average_models

    a, b = tmp_path / "a", tmp_path / "b"
    build_inference_free(tiny_encoder_dir, a, idf={"seoul": 2.0, "cat": 4.0})
    shutil.copytree(a, b)
    query_weights = next(p for p in b.rglob("model.safetensors") if "SparseStaticEmbedding" in p.parent.name)
    learned = load_file(str(query_weights))
    save_file({"weight": learned["weight"] * 3.0}, str(query_weights))
    soup = average_models([a, b], tmp_path / "soup")
    idf = json.loads((soup / "idf.json").read_text())
    assert idf["seoul"] == pytest.approx(4.0) and idf["cat"] == pytest.approx(8.0)
    assert json.loads((a / "idf.json").read_text())["cat"] == 4.0
