"""Real model architectures through the whole chain.

Fast (default suite): every architecture of ``benchmarks/arch_models.py`` at reduced width with its
REAL vocabulary (BERT 30,522, XLM-R 250,002, ModernBERT 50,368 rows) goes through SemBridge and VT
surgery, export and the ML Commons conformance check, so a regression in any architecture's code
path shows in CI. The bridge is a deterministic character-trigram hash (the bridge's quality is not
under test; the multilingual bridge is exercised by tests/transfer).

Slow (``-m slow``): the real-size cells of ``benchmarks/arch_matrix.py`` (each step in a subprocess,
wall time and peak RSS recorded), one test per architecture x step.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


arch_models = _load("arch_models")


class TrigramHashBridge:
    """Stand-in bridge: hashed character trigrams of the surface, L2-normalised (deterministic)."""

    name = "test:trigram-hash"

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim

    def embed(self, texts, desc: str = "") -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            padded = f"^{text}$"
            for j in range(max(1, len(padded) - 2)):
                out[i, zlib.crc32(padded[j:j + 3].encode("utf-8")) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


@pytest.fixture(scope="module")
def arch_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("arch_cache")


def _source(name: str, tmp_path: Path, arch_cache: Path) -> Path:
    if arch_models.ARCHS[name].tokenizer == "modernbert":
        from opensearch_lsr.resources import shared_data_dir

        if shared_data_dir() is None:
            pytest.skip("the ModernBERT stand-in tokenizer is trained on the shared msmarco corpora")
    return arch_models.build_source(name, tmp_path / "source", "reduced", cache=arch_cache)


@pytest.mark.parametrize("name", list(arch_models.ARCHS))
def test_reduced_arch_transfer_export_conformance(name, tmp_path, arch_cache, tiny_target_tokenizer_dir):
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM

    from opensearch_lsr.opensearch.artifacts import export_bundle
    from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer
    from opensearch_lsr.transfer.surgery import mlm_parts

    spec = arch_models.ARCHS[name]
    src = _source(name, tmp_path, arch_cache)
    cfg = AutoConfig.from_pretrained(str(src))
    assert cfg.vocab_size == {"bert": 30522, "distilbert": 30522, "xlm-roberta": 250002,
                              "modernbert": 50368}[spec.model_type]
    out = sembridge_transfer(SemBridgeConfig(source=str(src), target_tokenizer=str(tiny_target_tokenizer_dir),
                                             out=str(tmp_path / "sembridge")), bridge=TrigramHashBridge())
    model = AutoModelForMaskedLM.from_pretrained(str(out))
    parts = mlm_parts(model)
    assert parts.tied == spec.tied
    assert parts.vocab_size == model.config.vocab_size == 5 + 21
    if not spec.tied:  # an untied decoder keeps its own rows: the overlap rows equal the SOURCE decoder's
        src_model = AutoModelForMaskedLM.from_pretrained(str(src))
        src_parts = mlm_parts(src_model)
        facts = json.loads((out / "transfer_config.json").read_text())
        assert facts["tied_decoder"] is False
        from transformers import AutoTokenizer

        s_tok, t_tok = AutoTokenizer.from_pretrained(str(src)), AutoTokenizer.from_pretrained(str(out))
        t_id, s_id = t_tok.convert_tokens_to_ids("house"), s_tok.convert_tokens_to_ids("house")
        torch.testing.assert_close(parts.output_layer.weight[t_id], src_parts.output_layer.weight[s_id])
        torch.testing.assert_close(parts.input_embeddings.weight[t_id], src_parts.input_embeddings.weight[s_id])
        assert not torch.equal(parts.output_layer.weight, parts.input_embeddings.weight)

    if spec.model_type == "xlm-roberta":
        _check_overlap_text_keeps_hidden_states(src, out)

    manifest = export_bundle(out, tmp_path / "bundle", verify=True)
    assert manifest["conformance"]["passed"], manifest["conformance"]
    assert manifest["vocab_size"] == 26


def _check_overlap_text_keeps_hidden_states(src: Path, out: Path) -> None:
    """A text made only of overlap tokens gets the source model's hidden states after the transfer.

    XLM-R: the overlap must pair WordPiece "house" with "▁house" (not the continuation piece "house"),
    and RoBERTa-family models number positions from the pad id (pad + 1 onwards), so swapping in a
    vocabulary with another pad id (kobigbird [PAD] 0 vs <pad> 1) must not shift every position.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    s_tok, t_tok = AutoTokenizer.from_pretrained(str(src)), AutoTokenizer.from_pretrained(str(out))
    text = "house cat cat house cat"
    s_ids, t_ids = s_tok(text, return_tensors="pt")["input_ids"], t_tok(text, return_tensors="pt")["input_ids"]
    assert s_ids.shape == t_ids.shape  # one piece per word on both sides
    with torch.no_grad():
        h_s = AutoModel.from_pretrained(str(src))(input_ids=s_ids).last_hidden_state
        h_t = AutoModel.from_pretrained(str(out))(input_ids=t_ids).last_hidden_state
    torch.testing.assert_close(h_t, h_s, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["bert-base-untied"])
def test_reduced_arch_vt(name, tmp_path, arch_cache, tiny_target_tokenizer_dir):
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from opensearch_lsr.transfer.surgery import mlm_parts
    from opensearch_lsr.transfer.vt import VTConfig, vt_transfer

    spec = arch_models.ARCHS[name]
    src = _source(name, tmp_path, arch_cache)
    out = vt_transfer(VTConfig(source=str(src), target_tokenizer=str(tiny_target_tokenizer_dir), init="subtoken",
                               out=str(tmp_path / "vt")))
    model = AutoModelForMaskedLM.from_pretrained(str(out))
    parts = mlm_parts(model)
    assert parts.tied == spec.tied and parts.vocab_size == 26
    if not spec.tied:
        src_parts = mlm_parts(AutoModelForMaskedLM.from_pretrained(str(src)))
        s_tok, t_tok = AutoTokenizer.from_pretrained(str(src)), AutoTokenizer.from_pretrained(str(out))
        t_id, s_id = t_tok.convert_tokens_to_ids("house"), s_tok.convert_tokens_to_ids("house")
        torch.testing.assert_close(parts.output_layer.weight[t_id], src_parts.output_layer.weight[s_id])


@pytest.mark.parametrize("alpha", [1.0, 1.5, 4.0])
def test_bounded_blocks_and_value_rows_are_exact(alpha):
    """The memory fixes of the 250k-candidate init change nothing: blocks capped by bytes and source rows
    read through ``value_rows`` (no ``values[candidates]`` copy) give the reference result."""
    from opensearch_lsr.transfer.alignment import entmax_mixing, entmax_mixing_full

    rng = np.random.default_rng(3)
    t = rng.normal(size=(300, 16)).astype(np.float32)
    s = rng.normal(size=(500, 16)).astype(np.float32)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    s /= np.linalg.norm(s, axis=1, keepdims=True)
    values = rng.normal(size=(800, 5)).astype(np.float32)
    rows = np.sort(rng.choice(800, size=500, replace=False))
    blocks = []
    small = entmax_mixing(t, s, values, alpha, 0.1, top_k=4, value_rows=rows, max_block_bytes=4 * 500 * 7,
                          progress=blocks.append)
    assert blocks == [7] * 42 + [6]  # 7 rows per block: 7 x 500 x 4 bytes
    default = entmax_mixing(t, s, values[rows], alpha, 0.1, top_k=4)
    np.testing.assert_allclose(small.mixed, default.mixed, atol=1e-6)
    assert (small.weights != default.weights).nnz == 0
    if alpha > 1:
        mixed, weights = entmax_mixing_full(t, s, values[rows], alpha, 0.1)
        np.testing.assert_allclose(small.mixed, mixed, atol=1e-5)
        np.testing.assert_allclose(small.weights.toarray(), weights.toarray(), atol=1e-6)
    with pytest.raises(ValueError, match="value_rows"):
        entmax_mixing(t, s, values, alpha, value_rows=rows[:10])


def test_write_zip_streams_files_byte_identically(tmp_path):
    """A member given as a file path (streamed) yields the same zip bytes as the same content in memory."""
    from opensearch_lsr.opensearch.trace import write_zip

    payload = np.random.default_rng(0).bytes(3 << 20)  # 3 MiB: several copy blocks
    (tmp_path / "m.pt").write_bytes(payload)
    write_zip(tmp_path / "a.zip", {"m.pt": tmp_path / "m.pt", "tokenizer.json": b"{}"})
    write_zip(tmp_path / "b.zip", {"m.pt": payload, "tokenizer.json": b"{}"})
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


def test_trace_leaves_the_model_as_it_was(tmp_path, tiny_source_dir):
    """The trace runs on the model itself (no deepcopy): mode, attention implementation and weights are restored."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from opensearch_lsr.opensearch.trace import trace_encoding_zip

    mlm = AutoModelForMaskedLM.from_pretrained(str(tiny_source_dir), attn_implementation="sdpa")
    mlm.train()
    before = {k: v.clone() for k, v in mlm.state_dict().items()}
    text = AutoTokenizer.from_pretrained(str(tiny_source_dir)).backend_tokenizer.to_str()
    _, facts = trace_encoding_zip(mlm, text, tmp_path / "enc.zip", model_name="t", vocab_size=mlm.config.vocab_size,
                                  special_ids=[0], pooling="max", activation="relu", prune_ratio=None)
    assert "aten::scaled_dot_product_attention" not in facts["ops"]  # traced with eager attention
    assert mlm.training and mlm.config._attn_implementation == "sdpa"
    assert all(torch.equal(before[k], v) for k, v in mlm.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(arch_models.ARCHS))
def test_real_size_matrix_row(name, tmp_path):
    """Every step of ``benchmarks/arch_matrix.py`` at real size passes with each step below 8 GB resident.

    Minutes to an hour per architecture on 2 cores (XLM-R's bridge pass over 250k pieces dominates the
    first run; the bridge cache is shared with later runs). Run under the shared lock.
    """
    import os
    import subprocess

    from opensearch_lsr.resources import shared_data_dir

    if shared_data_dir() is None:
        pytest.skip("needs the shared data (kobigbird tokenizer, msmarco-ko)")
    env = {**os.environ, "ARCH_MATRIX_OUT": str(tmp_path), "ARCH_MATRIX_SCALE": "real"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "arch_matrix.py"), "run", "--arch", name,
                    "--budget-s", "1e9"], env=env, check=True, cwd=str(ROOT))
    cells = {p.name: json.loads(p.read_text()) for p in (tmp_path / "architectures").glob(f"{name}__*.json")}
    steps = _load("arch_matrix").STEPS
    assert sorted(cells) == sorted(f"{name}__{s}.json" for s in steps)
    failed = {k: v["output_tail"][-500:] for k, v in cells.items() if not v["passed"]}
    assert not failed, failed
    assert max(v["peak_rss_mb"] for v in cells.values()) < 8 * 1024


def test_modernbert_uses_the_split_head_fast_path(tmp_path, arch_cache):
    """ModernBertForMaskedLM is encoded through the body/head/decoder split (no [batch, length, vocab]
    logits, the memory-bounded path) with the same pooled logits as the full forward."""
    import torch

    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder

    src = _source("modernbert-base", tmp_path, arch_cache)
    enc = SparseDocumentEncoder(src, device="cpu", batch_size=4)
    assert enc.head is not None
    texts = ["서울은 한국의 수도이다.", "a short one", "ModernBERT " * 40, "x"]
    fast = enc.encode_pooled_logits(texts)
    enc.head = None  # the generic full-logits path
    full = enc.encode_pooled_logits(texts)
    torch.testing.assert_close(fast, full, atol=1e-4, rtol=1e-4)


def test_cli_vt_without_apc_prints_its_summary(tmp_path, tiny_source_dir, tiny_target_tokenizer_dir):
    """`lsr-os transfer vt` without --apc wrote the model, then crashed printing the summary (the
    transfer_config key ``apc`` is the config's ``False`` when no calibration ran)."""
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    res = CliRunner().invoke(cli, ["transfer", "vt", "--source", str(tiny_source_dir), "--target-tokenizer",
                                   str(tiny_target_tokenizer_dir), "--init", "subtoken", "--out", str(tmp_path / "vt")])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["method"] == "vt" and "apc" not in summary



def test_byte_level_surfaces_are_decoded_text(arch_cache, tiny_target_tokenizer_dir):
    """Byte-level BPE pieces (ModernBERT, RoBERTa) store UTF-8 bytes as printable stand-ins: the surface
    the bridge embeds and the overlap compares is the decoded text ("ĠìĦľìļ¸" -> "서울"), so Korean target
    tokens find their byte-level twins (msmarco-trained stand-in vs kobigbird: 2,107 -> 10,746 overlaps)."""
    from transformers import AutoTokenizer

    from opensearch_lsr.transfer.vocab import find_overlap, vocab_tokens

    spec = arch_models.ARCHS["modernbert-base"]
    from opensearch_lsr.resources import shared_data_dir

    if shared_data_dir() is None:
        pytest.skip("the ModernBERT stand-in tokenizer is trained on the shared msmarco corpora")
    source = AutoTokenizer.from_pretrained(str(arch_models.source_tokenizer_dir(spec, arch_cache)))
    by_raw = {t.raw: t for t in vocab_tokens(source)}
    seoul = by_raw["ĠìĦľìļ¸"]
    assert (seoul.surface, seoul.continuation) == ("서울", False)
    assert by_raw["Ġhouse"].surface == "house" and by_raw["house"].continuation
    target = AutoTokenizer.from_pretrained(str(tiny_target_tokenizer_dir))
    assert find_overlap(source, target)[target.convert_tokens_to_ids("서울")] == seoul.id
