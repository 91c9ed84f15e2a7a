"""Export bundle: zip layout, TorchScript contract, truncation, pruning, collisions, bad input, CLI."""
from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opensearch_lsr.opensearch.artifacts import (  # noqa: E402
    ExportConfig,
    ExportError,
    detect_key_collisions,
    export_bundle,
    parse_prune,
)
from opensearch_lsr.opensearch.conformance import MLCommonsRuntime, check_zip_layout  # noqa: E402

LONG_TEXT = " ".join(["seoul is the capital city of korea and the river runs through it"] * 120)


def _pt_member(zip_path: Path) -> str:
    with zipfile.ZipFile(zip_path) as zf:
        return next(n for n in zf.namelist() if n.endswith(".pt"))


def _load_pt(zip_path: Path, tmp_path: Path):
    name = _pt_member(zip_path)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extract(name, tmp_path)
    return torch.jit.load(str(tmp_path / name))


@pytest.fixture(scope="module")
def tiny_bundle(tiny_source_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_bundle")
    manifest = export_bundle(str(tiny_source_dir), out, verify=True)
    return out, manifest


@pytest.fixture(scope="module")
def splade_bundle(splade_tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("splade_bundle")
    corpus = out.parent / "splade_idf_corpus.txt"
    corpus.write_text("seoul is the capital of korea\nthe river han flows through seoul\nparis is in france\n",
                      encoding="utf-8")
    manifest = export_bundle("splade-tiny", out, idf_corpus=str(corpus), verify=True)
    return out, manifest


# --------------------------------------------------------------------------- layout and manifest


def test_zip_layout_and_manifest_hashes(tiny_bundle):
    out, manifest = tiny_bundle
    enc, tok = out / "sparse_encoding.zip", out / "sparse_tokenize.zip"
    with zipfile.ZipFile(enc) as zf:
        names = sorted(zf.namelist())
    assert len([n for n in names if n.endswith(".pt")]) == 1
    assert names == sorted([manifest["sparse_encoding"]["model_file"], "tokenizer.json"])
    assert all("/" not in n for n in names)
    with zipfile.ZipFile(tok) as zf:
        assert sorted(zf.namelist()) == ["tokenizer.json"]  # no IDF source given: ML Commons weighs 1.0
    assert check_zip_layout(enc, "SPARSE_ENCODING") == [] and check_zip_layout(tok, "SPARSE_TOKENIZE") == []
    for key, path in (("sparse_encoding", enc), ("sparse_tokenize", tok)):
        entry = manifest[key]
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert entry["size_bytes"] == path.stat().st_size
        assert entry["model_format"] == "TORCH_SCRIPT"
    assert manifest["sparse_encoding"]["function_name"] == "SPARSE_ENCODING"
    assert manifest["sparse_tokenize"]["function_name"] == "SPARSE_TOKENIZE"
    assert manifest["key_format"] == "word" and manifest["vocab_size"] == 5 + 22
    assert manifest["conformance"]["passed"] and manifest["conformance"]["max_abs_weight_diff"] <= 1e-4
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert ExportConfig.load(out).key_format == "auto"
    for version_key in ("torch_version", "transformers_version", "toolkit_version", "vocab_sha256", "tokenizer_sha256"):
        assert manifest[version_key]
    with zipfile.ZipFile(enc) as zf:
        assert hashlib.sha256(zf.read("tokenizer.json")).hexdigest() == manifest["tokenizer_sha256"]


def test_tokenizer_json_truncation_block_and_padding(tiny_bundle):
    out, manifest = tiny_bundle
    with zipfile.ZipFile(out / "sparse_encoding.zip") as zf:
        spec = json.loads(zf.read("tokenizer.json"))
    # the fixture model has 64 position embeddings, so the cap is min(512, 64)
    assert spec["truncation"] == {"direction": "Right", "max_length": 64, "strategy": "LongestFirst", "stride": 0}
    assert spec["padding"]["strategy"] == "BatchLongest" and spec["padding"]["pad_token"] == "[PAD]"
    assert manifest["max_length"] == 64


def test_torchscript_is_old_runtime_friendly(tiny_bundle):
    _, manifest = tiny_bundle
    ts = manifest["torchscript"]
    assert ts["file_format_version"] <= 10  # what torch 1.13 reads
    assert "aten::scaled_dot_product_attention" not in ts["ops"]  # eager attention


# --------------------------------------------------------------------------- forward contract


def test_forward_takes_one_dict_and_returns_one_output(tiny_bundle, tmp_path):
    out, manifest = tiny_bundle
    module = _load_pt(out / "sparse_encoding.zip", tmp_path)
    schema = str(module.forward.schema)
    assert "Dict(str, Tensor) input" in schema and schema.endswith("-> Dict(str, Tensor)")
    ids = torch.tensor([[2, 5, 10, 12, 3]])
    mask = torch.ones_like(ids)
    result = module({"input_ids": ids, "attention_mask": mask})
    assert list(result) == ["output"]
    vec = result["output"]
    assert vec.dtype == torch.float32 and tuple(vec.shape) == (1, manifest["vocab_size"])
    assert (vec >= 0).all()
    assert (vec[0, manifest["special_token_ids"]] == 0).all()
    # token_type_ids is not part of the contract: an extra key is ignored, a missing key fails
    with_tt = module({"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.ones_like(ids)})
    assert torch.equal(with_tt["output"], vec)
    with pytest.raises(Exception):
        module({"input_ids": ids})
    # a padded batch of two gives the same rows as two single calls (the trace generalises)
    ids2 = torch.tensor([[2, 5, 10, 12, 3], [2, 7, 3, 0, 0]])
    mask2 = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    batch = module({"input_ids": ids2, "attention_mask": mask2})["output"]
    single = module({"input_ids": ids2[1:, :3], "attention_mask": mask2[1:, :3]})["output"]
    assert torch.allclose(batch[0], vec[0], atol=1e-6) and torch.allclose(batch[1], single[0], atol=1e-6)


def test_long_text_truncates_to_model_limit(tiny_bundle):
    out, _ = tiny_bundle
    rt = MLCommonsRuntime.from_zip(out / "sparse_encoding.zip")
    assert len(rt.encode_ids(LONG_TEXT)) == 64
    (weights,) = rt.predict([LONG_TEXT])
    assert weights and all(v > 0 for v in weights.values())


# --------------------------------------------------------------------------- pruning


def test_max_ratio_pruning_in_graph(tiny_source_dir, tiny_bundle, tmp_path):
    out, _ = tiny_bundle
    pruned = export_bundle(str(tiny_source_dir), tmp_path / "pruned", prune="max_ratio:0.5", verify=True)
    assert pruned["prune_type"] == "max_ratio" and pruned["prune_ratio"] == 0.5
    full_rt = MLCommonsRuntime.from_zip(out / "sparse_encoding.zip")
    pruned_rt = MLCommonsRuntime.from_zip(tmp_path / "pruned" / "sparse_encoding.zip")
    for text in ["the cat is in the house", "paris is the capital of france", "seoul korea river"]:
        full, cut = full_rt.raw_output(text), pruned_rt.raw_output(text)
        expected = np.where(full >= 0.5 * full.max(), full, 0.0)
        np.testing.assert_allclose(cut, expected, atol=1e-6)
        assert 0 < np.count_nonzero(cut) <= np.count_nonzero(full)


@pytest.mark.parametrize("bad", ["top_k:10", "max_ratio:1.0", "max_ratio:-0.1", "max_ratio:x", "max_ratio"])
def test_bad_prune_strings(bad):
    with pytest.raises(ValueError):
        parse_prune(bad)


def test_prune_none_spellings():
    assert parse_prune(None) is None and parse_prune("none") is None and parse_prune("max_ratio:0") is None
    assert parse_prune("max_ratio:0.1") == pytest.approx(0.1)


# --------------------------------------------------------------------------- key collisions


def _collision_model_dir(path: Path, kind: str) -> Path:
    """A tiny MLM whose tokenizer has a Metaspace or ByteLevel decoder (built here with tokenizers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    if kind == "metaspace":
        words = ["▁hello", "hello", "▁world", "world", "▁seoul"]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    else:
        words = ["Ġhello", "hello", "Ġworld", "world", "Ġseoul"]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", model_max_length=32)
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(specials) + len(words), hidden_size=16, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    model = BertForMaskedLM(cfg)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0, 1.0)
    model.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("kind", ["metaspace", "bytelevel"])
def test_collision_detection(kind, tmp_path):
    from transformers import AutoTokenizer

    model_dir = _collision_model_dir(tmp_path / kind, kind)
    report = detect_key_collisions(AutoTokenizer.from_pretrained(str(model_dir)))
    assert report["collides"]
    assert report["risky_decoder"] == (["Metaspace"] if kind == "metaspace" else ["ByteLevel"])
    if kind == "metaspace":
        assert report["duplicate_keys"] >= 2  # ▁hello/hello and ▁world/world


def test_wordpiece_does_not_collide(tiny_source_dir):
    from transformers import AutoTokenizer

    report = detect_key_collisions(AutoTokenizer.from_pretrained(str(tiny_source_dir)))
    assert not report["collides"] and report["decoder"] == "WordPiece"


def test_colliding_tokenizer_word_refused_auto_switches_to_token_id(tmp_path):
    model_dir = _collision_model_dir(tmp_path / "meta", "metaspace")
    with pytest.raises(ExportError, match="token_id"):
        export_bundle(str(model_dir), tmp_path / "word", key_format="word", verify=False)
    manifest = export_bundle(str(model_dir), tmp_path / "auto", key_format="auto", verify=True)
    assert manifest["key_format"] == "token_id" and manifest["min_opensearch_version"] == "3.2.0"
    assert manifest["conformance"]["passed"]
    rt = MLCommonsRuntime.from_zip(tmp_path / "auto" / "sparse_encoding.zip")
    (weights,) = rt.predict(["hello world"], embedding_format="token_id")
    assert weights and all(k.isdigit() for k in weights)


# --------------------------------------------------------------------------- bad input and CLI


def test_bad_inputs_give_clear_errors(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export_bundle(str(tmp_path / "missing"), tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="not a SparseEncoder"):
        export_bundle(str(tmp_path / "empty"), tmp_path / "out")
    from transformers import BertConfig, BertModel

    plain = tmp_path / "plain_bert"
    BertModel(BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(str(plain))
    with pytest.raises(ExportError, match="not a masked-LM"):
        export_bundle(str(plain), tmp_path / "out")
    with pytest.raises(ValueError, match="key_format"):
        export_bundle(str(plain), tmp_path / "out", key_format="words")


def test_cli_export(tiny_source_dir, tmp_path):
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    runner = CliRunner()
    result = runner.invoke(cli, ["export", str(tiny_source_dir), "--out", str(tmp_path / "b"), "--no-verify",
                                 "--name", "tiny", "--version", "2.0.0"])
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    assert manifest["name"] == "tiny" and manifest["version"] == "2.0.0"
    assert _pt_member(tmp_path / "b" / "sparse_encoding.zip") == "tiny.pt"
    bad = runner.invoke(cli, ["export", str(tiny_source_dir), "--out", str(tmp_path / "c"), "--prune", "top_k:5"])
    assert bad.exit_code != 0 and "max_ratio" in bad.output and "Traceback" not in bad.output


def test_export_is_reproducible(tiny_source_dir, tiny_bundle, tmp_path):
    out, manifest = tiny_bundle
    again = export_bundle(str(tiny_source_dir), tmp_path / "again", verify=False)
    assert again["tokenizer_sha256"] == manifest["tokenizer_sha256"]
    assert again["sparse_tokenize"]["sha256"] == manifest["sparse_tokenize"]["sha256"]
    assert again["vocab_sha256"] == manifest["vocab_sha256"]


# --------------------------------------------------------------------------- SPLADE-tiny (real model)


def test_splade_tiny_conformance(splade_bundle):
    out, manifest = splade_bundle
    report = manifest["conformance"]
    print(f"SPLADE-tiny conformance: max |w_zip - w_python| = {report['max_abs_weight_diff']:.3e}, "
          f"key mismatches {report['key_mismatches']}")
    assert report["passed"] and report["max_abs_weight_diff"] <= 1e-4 and report["key_mismatches_above_atol"] == 0
    assert manifest["vocab_size"] == 30522 and manifest["max_length"] == 512 and manifest["key_format"] == "word"


def test_splade_tiny_truncates_at_512_and_idf_ships(splade_bundle):
    out, manifest = splade_bundle
    rt = MLCommonsRuntime.from_zip(out / "sparse_encoding.zip")
    assert rt.max_length == 512 and len(rt.encode_ids(LONG_TEXT)) == 512
    (weights,) = rt.predict([LONG_TEXT])
    assert "seoul" in weights and min(weights.values()) > 0
    assert manifest["idf"]["entries"] == 30522 - 5
    tok_rt = MLCommonsRuntime.from_zip(out / "sparse_tokenize.zip", "SPARSE_TOKENIZE")
    (q,) = tok_rt.predict(["seoul seoul paris unseenword"])
    assert q["seoul"] < q["paris"] or q["seoul"] == pytest.approx(q["paris"])  # df(seoul)=2 >= df(paris)=1
    assert all(v > 0 for v in q.values())


def test_inference_free_router_exports_document_route_and_idf(tiny_source_dir, tmp_path):
    inference_free = pytest.importorskip("opensearch_lsr.inference_free")
    corpus = ["the cat is in the house", "paris is the capital of france", "the river in seoul"]
    inference_free.build_inference_free(str(tiny_source_dir), tmp_path / "router", idf_corpus=corpus)
    manifest = export_bundle(str(tmp_path / "router"), tmp_path / "bundle", verify=True)
    assert manifest["conformance"]["passed"] and manifest["idf"]["source"].startswith("file:")
    tok_rt = MLCommonsRuntime.from_zip(tmp_path / "bundle" / "sparse_tokenize.zip", "SPARSE_TOKENIZE")
    (q,) = tok_rt.predict(["the cat"])
    assert q["cat"] > q["the"] > 0  # df(cat)=1 < df(the)=3
