"""The engine contract's token-key rules, and every path that turns vectors into keys agreeing on
them for a tokenizer whose single-id decodes collide (ML Commons: the later id wins)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from opensearch_lsr.contract import (FLOAT_MIN_NORMAL, decode_keys, key_table, special_token_ids,
                                     truncate_feature_value, vector_to_keys)

TEXT = "the cat is a house of paris"


def test_vector_to_keys_later_id_wins_and_drops_empty_keys():
    keys = ["", "a", "b", "a"]
    assert vector_to_keys([3, 1, 2, 0], [0.5, 2.0, 1.0, 9.0], keys) == {"a": 0.5, "b": 1.0}
    assert vector_to_keys([3, 1], [0.5, 2.0], None) == {"1": 2.0, "3": 0.5}
    assert vector_to_keys([7], [1.0], keys) == {}  # past the table: no key


def test_limits_and_truncation():
    assert truncate_feature_value(1.7) == 1.69921875
    assert FLOAT_MIN_NORMAL == np.finfo(np.float32).tiny


def test_cli_field_defaults_are_the_contract_defaults():
    """The CLI states the field defaults as literals (the contract module pulls in numpy, which
    ``lsr-os --help`` does not load); they must stay the contract's."""
    import click

    from opensearch_lsr.cli import cli
    from opensearch_lsr.contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD

    want = {"text_field": DEFAULT_TEXT_FIELD, "vector_field": DEFAULT_VECTOR_FIELD, "sparse_field": DEFAULT_VECTOR_FIELD}
    seen = []
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and param.name in want:
                seen.append(name)
                assert param.default == want[param.name], f"lsr-os {name} --{param.name.replace('_', '-')}"
    assert {"index", "search", "create-index", "create-pipeline"} <= set(seen)


@pytest.fixture(scope="module")
def colliding_model_dir(tiny_source_dir, tmp_path_factory):
    """The tiny source model with a Metaspace decoder and ``cats`` renamed ``▁cat``: ids of ``cat`` and
    ``▁cat`` both decode to ``"cat"``; MLM biases make both fire, the later id weaker than the earlier."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM

    from opensearch_lsr.transfer.surgery import save_sparse_encoder

    tok_dir = tmp_path_factory.mktemp("colliding_tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_source_dir / name).exists():
            shutil.copy(tiny_source_dir / name, tok_dir / name)
    spec = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["▁cat"] = vocab.pop("cats")
    spec["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    (tok_dir / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # load tokenizer.json as it is (no BERT rebuild)
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    cat, meta_cat = tokenizer.convert_tokens_to_ids(["cat", "▁cat"])
    assert meta_cat > cat
    model = BertForMaskedLM.from_pretrained(str(tiny_source_dir))
    with torch.no_grad():
        model.cls.predictions.bias[cat] = 6.0
        model.cls.predictions.bias[meta_cat] = 3.0
    out = save_sparse_encoder(model, tokenizer, tmp_path_factory.mktemp("colliding_model"))
    return out, cat, meta_cat


def test_colliding_tokenizer_decodes_two_ids_to_one_key(colliding_model_dir):
    from transformers import AutoTokenizer

    path, cat, meta_cat = colliding_model_dir
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    keys = decode_keys(tokenizer)
    assert keys[cat] == keys[meta_cat] == "cat"
    assert all(keys[i] == "" for i in special_token_ids(tokenizer))
    assert key_table(tokenizer, "token_id")[meta_cat] == str(meta_cat)


def test_every_path_keys_colliding_decodes_alike(colliding_model_dir, tmp_path):
    """`lsr-os index`, the local backend (eval/quickstart documents and model_id queries), the
    conformance runtime on the exported zip, and client-side query tokens: same keys, and the
    colliding key carries the later id's weight (ML Commons), not the larger one."""
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.local.index import LocalIndex
    from opensearch_lsr.opensearch.artifacts import export_bundle
    from opensearch_lsr.opensearch.conformance import MLCommonsRuntime
    from opensearch_lsr.opensearch.query import query_tokens_for

    path, cat, meta_cat = colliding_model_dir
    dense = SparseDocumentEncoder(str(path), device="cpu").encode([TEXT])[0]
    weight = dict(zip(dense.ids.tolist(), dense.weights.tolist()))
    assert weight[cat] > weight[meta_cat] > 0  # both fire; the later id is the smaller

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "text": TEXT}) + "\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["index", "--corpus", str(corpus), "--model", str(path),
                                      "--index", str(tmp_path / "idx"), "--no-progress"])
    assert result.exit_code == 0, result.output
    indexed = LocalIndex.open(tmp_path / "idx").get("d1")["sparse_embedding"]

    keyed = SparseKeyedEncoder(str(path))
    local_doc = keyed.encode([TEXT], "document")[0]
    local_query = LocalIndex.create(tmp_path / "q", {"properties": {"v": {"type": "rank_features"}}}) \
        .query_encoder(str(path))(TEXT)
    client_query = query_tokens_for(TEXT, path)

    bundle = tmp_path / "bundle"
    export_bundle(str(path), str(bundle), key_format="token_id", verify=False)
    runtime = MLCommonsRuntime.from_zip(bundle / "sparse_encoding.zip", "SPARSE_ENCODING")
    served = runtime.predict([TEXT], "word")[0]

    for name, got in [("index", indexed), ("local document", local_doc), ("local query", local_query),
                      ("query_tokens", client_query), ("conformance", served)]:
        assert set(got) == set(served), name
        assert got["cat"] == pytest.approx(weight[meta_cat], rel=1e-4), name
