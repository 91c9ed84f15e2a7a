"""MILCO: LexEcho key layout, the source-view ablation, SparseEncoder round trip, SAP, CLI, lsr-os train."""
from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from opensearch_lsr.multilingual.milco import MilcoConfig, build_milco, is_milco_dir, load_milco, milco_key_names

TEXTS = ["서울은 한국의 수도이다", "the cat is in the house", "고양이 cat 서울 seoul"]


def _dense(model, texts):
    with torch.no_grad():
        return model.encode(texts, convert_to_tensor=True).to_dense()


def _build(xlmr, head, tmp_path, **kw):
    return build_milco(MilcoConfig(encoder=str(xlmr), sparse_head=str(head), out=str(tmp_path), sap=False, **kw))


def test_lexecho_key_layout(tiny_xlmr_dir, tiny_source_dir, tmp_path):
    model = _build(tiny_xlmr_dir, tiny_source_dir, tmp_path)
    head = model[1]
    v_src, v_en = head.source_vocab_size, head.pivot_vocab_size
    assert v_src == len(model.tokenizer) and model.get_embedding_dimension() == v_src + v_en
    dense = _dense(model, TEXTS)
    assert dense.shape == (len(TEXTS), v_src + v_en)
    for row, text in zip(dense, TEXTS):
        ids = set(model.tokenizer(text)["input_ids"]) - set(head.source_special_ids)
        source = set(torch.nonzero(row[:v_src]).flatten().tolist())
        # every non-special input token is echoed (the fresh [ECHO] row weighs each log(1 + 1)), nothing else
        assert source == ids and source
        assert torch.allclose(row[sorted(source)], torch.full((len(source),), math.log(2.0)))
        assert not row[head.source_special_ids].any()
        pivot = torch.nonzero(row[v_src:]).flatten()
        assert len(pivot) > 0 and not row[v_src + torch.tensor(head.pivot_special_ids)].any()
    names = milco_key_names(model)
    assert len(names) == v_src + v_en and names[v_src].startswith("en:") and names[5].startswith("src:")
    assert len(set(names)) == len(names)  # the two views never share a key

    ablation = _build(tiny_xlmr_dir, tiny_source_dir, tmp_path, source_view=False)
    assert ablation[1].source_view is False
    off = _dense(ablation, TEXTS)
    assert not off[:, :v_src].any()
    assert torch.allclose(off[:, v_src:], dense[:, v_src:])  # same seed: same connector, same pivot view


def test_sparse_encoder_round_trip(tiny_milco_dir):
    from sentence_transformers import SparseEncoder

    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    assert is_milco_dir(tiny_milco_dir)
    config = json.loads((tiny_milco_dir / "1_LexEchoHead" / "lexecho_config.json").read_text())
    assert config["source_view"] is True
    first = _dense(load_milco(tiny_milco_dir), TEXTS)
    assert torch.equal(first, _dense(SparseEncoder(str(tiny_milco_dir), device="cpu", trust_remote_code=True), TEXTS))
    again = load_sparse_encoder(str(tiny_milco_dir))  # the toolkit's loader (train, export, eval)
    assert torch.equal(first, _dense(again, TEXTS))
    assert again[1].pivot_tokenizer is not None and again.max_seq_length == 32


def test_sap_loss_decreases_and_resumes(tiny_xlmr_dir, tiny_source_dir, tiny_bitext, tmp_path):
    from opensearch_lsr.multilingual.bitext import read_bitext
    from opensearch_lsr.multilingual.milco import _load_teacher
    from opensearch_lsr.multilingual.sap import SAP_CHECKPOINT, SapConfig, run_sap

    teacher = _load_teacher(str(tiny_source_dir))
    model = build_milco(MilcoConfig(encoder=str(tiny_xlmr_dir), sparse_head=str(tiny_source_dir), out=str(tmp_path),
                                    sap=False), teacher=teacher)
    pairs = read_bitext(tiny_bitext)
    config = SapConfig(steps=40, batch_size=8, max_seq_length=32, lr=1e-2, warmup_ratio=0.0, logging_steps=1,
                       save_steps=20, threads=1)
    facts = run_sap(model, teacher, pairs, config, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "sap_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    first, last = rows[0]["loss"], rows[-1]["loss"]
    assert last < 0.5 * first, (first, last)
    assert rows[-1]["mse_target"] < rows[0]["mse_target"]
    assert all(r["active"] > 0 for r in rows)  # the pivot view never collapses to empty
    assert facts["steps"] == 40 and facts["resumed_from_step"] is None and (tmp_path / SAP_CHECKPOINT).is_file()
    # the encoder stays frozen in the default "connector" mode; every parameter is trainable again afterwards
    assert all(p.requires_grad for p in model.parameters())
    more = run_sap(model, teacher, pairs, SapConfig(**{**config.to_dict(), "steps": 44}), tmp_path)
    assert more["resumed_from_step"] == 40 and more["steps"] == 44


def test_cli_transfer_milco(tiny_xlmr_dir, tiny_source_dir, tiny_bitext, tmp_path):
    from opensearch_lsr.cli import cli

    out = tmp_path / "m"
    args = ["transfer", "milco", "--encoder", str(tiny_xlmr_dir), "--sparse-head", str(tiny_source_dir),
            "--bitext", str(tiny_bitext), "--sap-steps", "3", "--batch-size", "4", "--max-seq-length", "16",
            "--threads", "1", "--no-source-view", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["sap"]["steps"] == 3 and summary["key_format"] == "token_id" and summary["bitext_pairs"] == 8
    saved = json.loads((out / "milco_config.json").read_text())
    assert saved["source_view"] is False and saved["sap"]["steps"] == 3
    assert json.loads((out / "sap_config.json").read_text())["batch_size"] == 4
    assert not _dense(load_milco(out), TEXTS)[:, :saved["source_vocab_size"]].any()

    missing = CliRunner().invoke(cli, ["transfer", "milco", "--encoder", str(tiny_xlmr_dir), "--sparse-head",
                                       str(tiny_source_dir), "--out", str(tmp_path / "x")])
    assert missing.exit_code != 0 and "Error:" in missing.output and "bitext" in missing.output
    assert "Traceback" not in missing.output
    bad = tmp_path / "bad.tsv"
    bad.write_text("only english\n", encoding="utf-8")
    broken = CliRunner().invoke(cli, ["transfer", "milco", "--bitext", str(bad), "--out", str(tmp_path / "y")])
    assert broken.exit_code != 0 and f"{bad}:1:" in broken.output and "Traceback" not in broken.output


def test_lsr_os_train_fine_tunes_milco(tiny_milco_dir, tiny_source_dir, tmp_path):
    """Contrastive stage through the toolkit's trainer: SpladeLoss + FLOPS; training length restored on save."""
    from opensearch_lsr.training import TrainConfig, train

    data = tmp_path / "pairs.jsonl"
    rows = [{"query": ko, "positive": en} for en, ko in
            [("seoul is the capital of korea", "서울 수도"), ("the cat is in the house", "고양이 집"),
             ("the dog runs on the road", "개 길"), ("water of the river", "강 물")]]
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "ft"
    base = dict(dataset=str(data), batch_size=4, max_seq_length=16, lr=1e-3, max_steps=2, logging_steps=1, threads=1,
                eval_split=None, final_eval=False)
    result = train(TrainConfig(model=str(tiny_milco_dir), out=str(out), freeze_encoder="embeddings", **base))
    assert result.steps == 2
    tuned, start = load_milco(out), load_milco(tiny_milco_dir)
    assert tuned.max_seq_length == 32
    assert not torch.equal(_dense(tuned, TEXTS), _dense(start, TEXTS))
    # --freeze-encoder embeddings: the word-embedding matrix is untouched, the layers and the head moved
    embeddings = [m[0].auto_model.get_input_embeddings().weight for m in (tuned, start)]
    assert torch.equal(*embeddings)
    assert not torch.equal(tuned[0].auto_model.encoder.layer[0].attention.self.query.weight,
                           start[0].auto_model.encoder.layer[0].attention.self.query.weight)
    assert not torch.equal(tuned[1].connector[0].weight, start[1].connector[0].weight)
    with pytest.raises(ValueError, match="MILCO"):
        train(TrainConfig(model=str(tiny_source_dir), out=str(tmp_path / "no"), freeze_encoder="all", **base))
    with pytest.raises(ValueError, match="inference-free"):
        train(TrainConfig(model=str(tiny_milco_dir), out=str(tmp_path / "if"), inference_free=True, **base))


def test_sap_revives_dead_dimensions(tiny_xlmr_dir, tiny_source_dir, tmp_path):
    """All pooled logits negative (an empty pivot view): MSE alone has no gradient, the revival hinge has."""
    from opensearch_lsr.multilingual.sap import _align

    head = _build(tiny_xlmr_dir, tiny_source_dir, tmp_path)[1]
    pooled = torch.full((2, head.pivot_vocab_size), -1.0, requires_grad=True)
    target = torch.zeros(2, head.pivot_vocab_size)
    target[:, 7] = 1.5
    mse, revive, pivot = _align(head, pooled, target)
    assert not pivot.any() and float(revive) == 1.0
    mse.backward(retain_graph=True)
    assert not pooled.grad.any()
    revive.backward()
    assert pooled.grad[:, 7].lt(0).all() and pooled.grad[:, 8].eq(0).all()


def test_sap_epoch_batches_cover_the_bitext_once():
    from opensearch_lsr.multilingual.sap import epoch_batches

    pairs = [("x" * n, "y" * (n % 7)) for n in range(103)]
    batches = epoch_batches(pairs, 8, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(103))
    assert len(batches) == 13 and all(len(b) <= 8 for b in batches)
    assert batches == epoch_batches(pairs, 8, seed=3) and batches != epoch_batches(pairs, 8, seed=4)
    assert max(max(len(pairs[i][0]) for i in b) - min(len(pairs[i][0]) for i in b) for b in batches) < 20


def test_ridge_connector_init_fits_the_english_side(tiny_xlmr_dir, tiny_source_dir, tiny_bitext, tmp_path):
    """The closed-form connector brings the student's English pivot view closer to the teacher's."""
    from opensearch_lsr.multilingual.bitext import read_bitext
    from opensearch_lsr.multilingual.connector_init import pool_words, ridge_init_connector, word_spans
    from opensearch_lsr.multilingual.milco import _load_teacher
    from opensearch_lsr.multilingual.sap import teacher_vectors

    assert word_spans("the  cat,  sat") == [(0, 3), (5, 9), (11, 14)]
    states = torch.arange(6.0).reshape(3, 2)
    pooled = pool_words(states, [(0, 0), (0, 3), (5, 8)], [(0, 3), (5, 9), (11, 14)])
    assert torch.equal(pooled[0], states[1]) and torch.equal(pooled[1], states[2]) and pooled[2] is None

    teacher = _load_teacher(str(tiny_source_dir))
    model = build_milco(MilcoConfig(encoder=str(tiny_xlmr_dir), sparse_head=str(tiny_source_dir), out=str(tmp_path),
                                    sap=False), teacher=teacher)
    english = [en for en, _ in read_bitext(tiny_bitext)]
    target = teacher_vectors(teacher, english, 32)

    def error() -> float:
        with torch.no_grad():
            features = model[0](model.preprocess(english))
            _, pivot = model[1].views(features["token_embeddings"], features["attention_mask"], features["input_ids"])
        return float(((pivot - target) ** 2).sum())

    before = error()
    facts = ridge_init_connector(model, teacher, english, texts=8, max_length=32, ridge=0.1)
    assert facts["words"] >= 30 and facts["texts"] == 8
    assert error() < before
    norm = teacher[0].auto_model.base_model.encoder.layer[-1].output.LayerNorm
    assert torch.equal(model[1].connector[3].weight, norm.weight)


def test_query_tokens_for_a_milco_model_are_token_ids(tiny_milco_dir):
    """`lsr-os search --model <milco dir>`: word keys cannot name a MILCO vector (two vocabularies), so the
    client-side query_tokens are token ids, and they equal the encoder's own nonzero ids."""
    import torch

    from opensearch_lsr.multilingual.milco import load_milco
    from opensearch_lsr.opensearch.query import query_tokens_for

    text = "서울은 한국의 수도이다"
    tokens = query_tokens_for(text, tiny_milco_dir)  # default key_format "word" is overridden
    assert tokens and all(k.isdigit() for k in tokens)
    vec = load_milco(tiny_milco_dir).encode_query([text], convert_to_tensor=True)
    vec = vec.to_dense()[0] if vec.is_sparse else torch.as_tensor(vec)[0]
    expected = {str(i) for i in torch.nonzero(vec > 0).flatten().tolist()}
    assert set(tokens) == expected
