from __future__ import annotations

import numpy as np
import pytest
import torch

from opensearch_lsr.encoding.documents import DocumentBuilder, split_passages
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.pruning import PruneConfig

TEXTS = ["the cat is in the house", "seoul is the capital of korea", "a dog", "paris",
         "the river water of the city of paris france is a road", "books school cats dogs"]


def _st_dense(model_dir, texts, batch_size=4):
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    st = load_sparse_encoder(str(model_dir))
    emb = st.encode_document(texts, batch_size=batch_size, convert_to_tensor=True)
    return (emb.to_dense() if emb.is_sparse else emb).float()


def _compare(model_dir, texts, **kw):
    enc = SparseDocumentEncoder(model_dir, device="cpu", batch_size=4, **kw)
    ours = enc.encode_dense(texts)
    ref = _st_dense(model_dir, texts)
    keep = torch.ones(ref.shape[1], dtype=torch.bool)
    keep[enc.special_ids] = False
    assert (ours[:, ~keep] == 0).all(), "special-token dims must be zero"
    return (ours[:, keep] - ref[:, keep]).abs().max().item(), enc


@pytest.mark.parametrize("row_block,vocab_chunk", [(256, 2048), (8, 7), (10_000, 100_000)])
def test_equals_sentence_transformers_tiny(tiny_source_dir, row_block, vocab_chunk):
    diff, _ = _compare(tiny_source_dir, TEXTS, row_block=row_block, vocab_chunk=vocab_chunk)
    assert diff <= 1e-5


def test_equals_sentence_transformers_splade_tiny(splade_tiny_dir):
    texts = TEXTS + ["서울은 한국의 수도입니다. " * 3, "what is the capital of france? " * 20]
    diff, enc = _compare(splade_tiny_dir, texts)
    assert diff <= 1e-5
    vecs = enc.encode(texts)
    for v in vecs:
        assert v.weights.dtype == np.float32 and (v.weights > 0).all() and np.isfinite(v.weights).all()
        assert (np.diff(v.ids) > 0).all() and not set(v.ids.tolist()) & set(enc.special_ids)


def test_order_and_batch_independence(tiny_source_dir):
    a = SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=1).encode_dense(TEXTS)
    b = SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=64).encode_dense(TEXTS[::-1]).flip(0)
    assert torch.allclose(a, b, atol=1e-6)


def test_truncation_at_512_matches_truncated_text(splade_tiny_dir):
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu")
    long = " ".join(["word"] * 300 + ["seoul"] * 300)
    ids = enc.tokenize([long])[0]
    assert len(ids) == 512 and enc.count_tokens([long])[0] == 602
    head = enc.tokenizer.decode(ids[1:-1])
    assert torch.allclose(enc.encode_dense([long]), enc.encode_dense([head]), atol=1e-6)


def test_split_passages_cover_text_within_cap(splade_tiny_dir):
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu")
    text = " ".join(f"paragraph{i} about seoul and korea" for i in range(200))
    parts = split_passages(text, enc.tokenizer, 512)
    assert len(parts) > 1 and all(n <= 512 for n in enc.count_tokens(parts))
    assert " ".join(parts).split() == text.split()
    assert split_passages("short text", enc.tokenizer, 512) == ["short text"]


def test_document_builder_keys_and_prune(splade_tiny_dir):
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu")
    (vec,) = enc.encode(["the capital of korea is seoul"])
    word = DocumentBuilder(enc.keys).features(vec)
    assert word and all(k == enc.keys[i] for k, i in zip(word, vec.ids))
    tid = DocumentBuilder(None, "token_id").features(vec)
    assert list(tid) == [str(i) for i in vec.ids]
    top = DocumentBuilder(enc.keys, prune=PruneConfig("top_k", 5)).features(vec)
    assert len(top) == 5 and min(top.values()) >= sorted(word.values())[-5]
    mr = DocumentBuilder(enc.keys, prune=PruneConfig("max_ratio", 0.3)).features(vec)
    assert min(mr.values()) >= np.float32(0.3) * np.float32(max(word.values()))


def test_ray_style_dict_batch(tiny_source_dir):
    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu")
    out = enc({"text": np.array(TEXTS[:3], dtype=object), "id": np.arange(3)})
    assert list(out["id"]) == [0, 1, 2] and len(out["ids"]) == 3 and out["weights"][0].dtype == np.float32


def test_bad_options(tiny_source_dir):
    with pytest.raises(ValueError, match="precision"):
        SparseDocumentEncoder(tiny_source_dir, precision="int8")
    with pytest.raises(ValueError, match="max_length"):
        SparseDocumentEncoder(tiny_source_dir, max_length=1024)
    with pytest.raises(ValueError, match="fp16"):
        SparseDocumentEncoder(tiny_source_dir, device="cpu", precision="fp16")


def test_a_model_without_weights_is_one_sentence(tiny_source_dir, tmp_path):
    """transformers' OSError for missing weights becomes a ValueError, which the CLI prints as one ``Error:`` line."""
    import shutil

    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    broken = tmp_path / "no-weights"
    shutil.copytree(tiny_source_dir, broken)
    for weights in [*broken.glob("*.safetensors"), *broken.glob("*.bin")]:
        weights.unlink()
    with pytest.raises(ValueError, match="no loadable masked-LM weights") as err:
        SparseDocumentEncoder(broken, device="cpu")
    assert isinstance(err.value.__cause__, OSError)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "1", "text": "house cat"}\n')
    res = CliRunner().invoke(cli, ["index", "--model", str(broken), "--corpus", str(corpus), "--backend", "ndjson",
                                   "--index", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w")])
    assert res.exit_code != 0 and "no loadable masked-LM weights" in res.output and "Traceback" not in res.output
    from opensearch_lsr.transfer.surgery import TransferInputError, load_sparse_encoder

    with pytest.raises(TransferInputError, match="could not be loaded"):  # search's and export's loader
        load_sparse_encoder(str(broken))
    (broken / "modules.json").unlink(missing_ok=True)  # a bare masked-LM directory takes the other branch
    with pytest.raises(TransferInputError, match="could not be loaded"):
        load_sparse_encoder(str(broken))


def test_the_warm_up_cuts_its_texts_in_the_windows_asked_for_then_restores_the_encoders(splade_tiny_dir, monkeypatch):
    """The job's warm-up batches the corpus's first passages as its own windows will (CUDA graphs are captured per
    batch shape); the encoder's own window is back afterwards, even when the warm-up fails."""
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu", batching="packed")
    seen = []

    def encode(texts):
        seen.append((len(texts), enc.window_docs))
        if len(seen) == 2:
            raise RuntimeError("out of memory")

    monkeypatch.setattr(enc, "encode", encode)
    monkeypatch.setattr(enc, "device", torch.device("cuda"))  # the warm-up runs on CUDA only
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    default = enc.window_docs
    assert enc.warm_up(8, ["a", "b"], window_docs=64) >= 0 and enc.window_docs == default
    with pytest.raises(RuntimeError):
        enc.warm_up(8, window_docs=32)
    assert seen == [(10, 64), (8, 32)] and enc.window_docs == default
    assert len(enc.warm_up_texts(8, ["a"])) == 9
