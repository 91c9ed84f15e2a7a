from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from opensearch_lsr.training import TrainConfig, read_loss_log, train
from opensearch_lsr.training.data import TrainingDataError


def _config(model, dataset, out, **kw) -> TrainConfig:
    base = dict(model=str(model), dataset=str(dataset), out=str(out), batch_size=4, max_seq_length=16, lr=1e-3,
                logging_steps=1, eval_queries=4, eval_corpus=12, threads=1)
    base.update(kw)
    return TrainConfig(**base)


def test_train_few_steps_beir(tiny_encoder_dir, tiny_beir, tmp_path):
    from sentence_transformers import SparseEncoder

    out = tmp_path / "run"
    result = train(_config(tiny_encoder_dir, tiny_beir, out, max_steps=3))
    assert result.steps == 3 and result.pairs == 18 and result.loss == "infonce"
    for name in ("train_config.json", "loss_log.jsonl", "loss_curves.png", "train_summary.json", "modules.json"):
        assert (out / name).exists(), name
    rows = read_loss_log(out / "loss_log.jsonl")
    assert [r["step"] for r in rows if "base_loss" in r] == [1, 2, 3]
    assert result.initial_dev_subset is not None and 0 <= result.initial_dev_subset["mrr@10"] <= 1
    assert result.final_dev is not None and set(result.final_dev) >= {"mrr@10", "ndcg@10", "recall@100"}
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["lr"] == 1e-3 and saved["resolved_loss"] == "infonce" and saved["pairs"] == 18
    model = SparseEncoder(str(out), device="cpu")
    # trained at max_seq_length 16, saved at the starting model's inference length (32)
    assert model.max_seq_length == SparseEncoder(str(tiny_encoder_dir), device="cpu").max_seq_length == 32
    emb = model.encode_document(["cat house"], convert_to_tensor=True)
    assert emb.shape[-1] == len(model.tokenizer)
    # the weights moved away from the starting model
    start = SparseEncoder(str(tiny_encoder_dir), device="cpu")
    assert not torch.allclose(start.encode_document(["cat house"], convert_to_tensor=True).to_dense(),
                              emb.to_dense())


def _batch_loss(model_dir, dataset_rows, config):
    from opensearch_lsr.training.trainer import build_loss
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    model = load_sparse_encoder(str(model_dir))
    model.eval()
    loss = build_loss(model, "infonce", config)
    q = model.preprocess([r["query"] for r in dataset_rows])
    p = model.preprocess([r["positive"] for r in dataset_rows])
    with torch.no_grad():
        return float(loss([q, p], None)["base_loss"])


def test_loss_decreases_on_toy_task(tiny_encoder_dir, tiny_beir, tmp_path):
    from opensearch_lsr.training.data import load_training_data

    data = load_training_data(tiny_beir, "train")
    cfg = _config(tiny_encoder_dir, tiny_beir, tmp_path / "toy", epochs=10, lr=2e-2, eval_split=None,
                  document_regularizer_weight=0.0, query_regularizer_weight=0.0, batch_size=6)
    before = _batch_loss(tiny_encoder_dir, data.rows, cfg)
    train(cfg)
    after = _batch_loss(tmp_path / "toy", data.rows, cfg)
    assert after < 0.8 * before, (before, after)


def test_checkpoint_and_resume(tiny_encoder_dir, tiny_beir, tmp_path):
    out = tmp_path / "ck"
    first = train(_config(tiny_encoder_dir, tiny_beir, out, max_steps=4, save_steps=2, eval_split=None))
    assert first.steps == 4 and (out / "checkpoints" / "checkpoint-4").is_dir()
    resumed = train(_config(tiny_encoder_dir, tiny_beir, out, max_steps=6, save_steps=2, eval_split=None,
                            resume=True))
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("checkpoint-4")
    assert resumed.steps == 6
    steps = [r["step"] for r in read_loss_log(out / "loss_log.jsonl") if "base_loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 6 and 1 in steps  # earlier entries kept, no duplicates


def test_inference_free_trains_and_reloads(tiny_encoder_dir, tiny_beir, tmp_path):
    from sentence_transformers import SparseEncoder

    from opensearch_lsr.inference_free import is_inference_free

    out = tmp_path / "if"
    result = train(_config(tiny_encoder_dir, tiny_beir, out, max_steps=2, inference_free=True))
    assert result.steps == 2 and is_inference_free(out)
    rows = read_loss_log(out / "loss_log.jsonl")
    assert any("document_regularizer_loss" in r for r in rows)
    assert not any("query_regularizer_loss" in r for r in rows)  # static IDF queries are not regularised
    model = SparseEncoder(str(out), device="cpu")
    q = model.encode_query(["cat cat house"], convert_to_tensor=True).to_dense()[0]
    tok = model.tokenizer
    ids = [tok.convert_tokens_to_ids(t) for t in ("cat", "house")]
    assert (q > 0).sum() == 2 and all(q[i] > 0 for i in ids)  # bag of IDF weights, each token once
    # the query side is the export's corpus IDF (compute_idf over the BEIR corpus), frozen during training
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.idf import compute_idf

    idf = compute_idf(list(load_beir(tiny_beir, "train").corpus.values()), tok)
    assert idf["cat"] != idf["car"]  # different document frequencies, so the check below can fail
    q = model.encode_query(["cat car"], convert_to_tensor=True).to_dense()[0]
    for token in ("cat", "car"):
        assert float(q[tok.convert_tokens_to_ids(token)]) == pytest.approx(idf[token], rel=1e-6)
    assert json.loads((out / "idf.json").read_text()) == pytest.approx(idf)
    d = model.encode_document(["cat house"], convert_to_tensor=True)
    assert d.shape[-1] == len(tok)


def test_inference_free_query_lr_learns_the_idf_side(tiny_encoder_dir, tiny_beir, tmp_path):
    from sentence_transformers import SparseEncoder

    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.inference_free import idf_weight_vector
    from opensearch_lsr.idf import compute_idf

    out = tmp_path / "if_lr"
    train(_config(tiny_encoder_dir, tiny_beir, out, max_steps=3, inference_free=True, query_lr=0.5))
    model = SparseEncoder(str(out), device="cpu")
    tok = model.tokenizer
    start = idf_weight_vector(tok, compute_idf(list(load_beir(tiny_beir, "train").corpus.values()), tok))
    learned = next(m for m in model.modules() if type(m).__name__ == "SparseStaticEmbedding").weight.detach()
    assert not torch.allclose(learned, start) and float(learned.min()) >= 0
    # idf.json (what the export ships as the query side) holds the learned weights, every token kept:
    # OpenSearch would read a dropped key as 1.0
    saved = json.loads((out / "idf.json").read_text())
    from opensearch_lsr.contract import decode_keys

    assert set(saved) == {k for k in decode_keys(tok) if k} and 0 < min(saved.values()) <= max(saved.values()) <= 64
    for token in ("cat", "car", "house"):
        assert saved.get(token, 0.0) == pytest.approx(float(learned[tok.convert_tokens_to_ids(token)]), rel=1e-6)
    # a further run without --query-lr keeps the (now learned) weights frozen
    out2 = tmp_path / "if_frozen"
    train(_config(str(out), tiny_beir, out2, max_steps=1, inference_free=True))
    again = next(m for m in SparseEncoder(str(out2), device="cpu").modules()
                 if type(m).__name__ == "SparseStaticEmbedding").weight.detach()
    assert torch.equal(again, learned)
    with pytest.raises(ValueError, match="add --inference-free"):
        train(_config(tiny_encoder_dir, tiny_beir, tmp_path / "x", max_steps=1, query_lr=0.1))


def test_teacher_losses_from_jsonl(tiny_encoder_dir, tmp_path):
    rows = [{"query": f"cat {w}", "positive": f"cat {w} house", "negative": "the road", "scores": [5.0, 1.0]}
            for w in ("dog", "city", "river", "book")]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    res = train(_config(tiny_encoder_dir, path, tmp_path / "mm", max_steps=1))
    assert res.loss == "marginmse" and res.final_dev is None
    res = train(_config(tiny_encoder_dir, path, tmp_path / "kl", max_steps=1, loss="kldiv"))
    assert res.loss == "kldiv"
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "scores"}) + "\n" for r in rows))
    with pytest.raises(TrainingDataError, match="needs teacher scores"):
        train(_config(tiny_encoder_dir, path, tmp_path / "bad", max_steps=1, loss="marginmse"))


def test_cli_reports_bad_rows_without_traceback(tiny_encoder_dir, tmp_path):
    from opensearch_lsr.cli import cli

    path = tmp_path / "bad.jsonl"
    path.write_text('{"query": "cat", "positive": "cat house"}\n{"query": "cat"}\n', encoding="utf-8")
    res = CliRunner().invoke(cli, ["train", "--model", str(tiny_encoder_dir), "--dataset", str(path),
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "bad.jsonl:2: missing 'positive'" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["train", "--model", str(tiny_encoder_dir), "--dataset", str(path),
                                   "--out", str(tmp_path / "o"), "--bf16"])
    assert res.exit_code == 1 and ("bf16" in res.output or "bad.jsonl" in res.output)
