"""Export a ``SparseEncoder`` directory as one hash-versioned OpenSearch ML Commons bundle.

``export_bundle`` writes three files (``opensearch-contract.md`` sections 1.4-2.2, 6.7, 6.8):

* ``sparse_encoding.zip`` (function ``SPARSE_ENCODING``, format ``TORCH_SCRIPT``): one traced
  TorchScript ``<name>.pt`` plus ``tokenizer.json`` at the zip root. ``forward(input: Dict[str,
  Tensor]) -> Dict[str, Tensor]`` takes ``{"input_ids", "attention_mask"}`` (what DJL feeds; no
  ``token_type_ids``) and returns ``{"output": float32 [batch, V]}``: SPLADE max pooling of
  ``log(1 + relu(logits))`` over unmasked positions (Formal et al. 2021, SPLADE v2,
  arXiv:2109.10086; the pooling the model's own ``SpladePooling`` config names), special-token
  ids zeroed, and optionally neural-search's ``max_ratio`` pruning in the graph (keep
  ``v >= ratio * max(v)`` per row). The tokenizer carries a truncation block capped at 512 so
  ML Commons 2.11-2.14 (DJL 0.21, which truncates only when tokenizer.json says so) behaves
  like 2.15+ (DJL >= 0.28, which always caps at 512).
* ``sparse_tokenize.zip`` (function ``SPARSE_TOKENIZE``): the same ``tokenizer.json`` plus an
  optional ``idf.json`` keyed by the single-id decode, the inference-free query side.
* ``manifest.json``: sha256 and size of both zips, vocabulary and tokenizer hashes, key format,
  special ids, pruning, toolkit/torch/transformers versions, conformance report.

Steps of :func:`export_bundle`: key format (:func:`resolve_key_format`), trace
(:func:`opensearch_lsr.opensearch.trace.trace_encoding_zip`), IDF (:func:`resolve_query_idf`),
manifest (:func:`build_manifest`), conformance (:func:`~opensearch_lsr.opensearch.conformance.verify_bundle`).

Old runtimes (ML Commons 2.x ships PyTorch 1.13.1, 3.x ships 2.5.1): the model is traced with
eager attention (no ``scaled_dot_product_attention``, an op 1.13 lacks), with
``torch.jit.trace(..., strict=False)`` on a dict input (as opensearch-py-ml does), on CPU,
without ``torch.jit.freeze`` or optimisation passes (they emit fused/new ops), and the archive's
file-format version is checked against what torch 1.13 reads (<= 10). The graph's operator set
is recorded in the manifest. Loading on a real 1.13.1 runtime is NOT verified here (PyPI has
torch 1.13.1 only for CPython <= 3.10, this environment has 3.11); see
:data:`TORCH_113_MAX_FILE_FORMAT`. The recorded ops of a BERT trace (embedding, linear,
layer_norm, gelu with ``approximate``, softmax, matmul, where, index, arange, ...) all exist in
1.13 (gelu's ``approximate`` argument arrived in 1.12, which is why such archives carry file
format 10).

Device: the trace is taken on CPU, but the graph holds no device constant: the attention mask is
built in the graph from the input (``trace.SparseEncodingModule``) instead of by transformers' mask
utilities, which record ``torch.device("cpu")`` and pinned earlier exports to CPU ML nodes (DJL warms
a model up on every device of the node). ``manifest["ml_node_devices"]`` records it (``["any"]``;
older bundles ``["cpu"]``). A deploy on a real GPU ML node has not been run (no GPU available).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Literal

from ..config import ArtifactConfig, sha256_file, write_json
from ..contract import MAX_LENGTH, decode_keys, special_token_ids
from ..engines.export_core import DEFAULT_VERIFY_TEXTS, ExportError, is_lexecho, resolve_encoder
from ..pruning import parse_prune as parse_prune_spec
from .trace import TORCH_113_MAX_FILE_FORMAT, trace_encoding_zip, write_zip

__all__ = [
    "ExportConfig",
    "ExportError",
    "DEFAULT_VERIFY_TEXTS",
    "export_bundle",
    "resolve_key_format",
    "resolve_query_idf",
    "build_manifest",
    "parse_prune",
    "detect_key_collisions",
    "build_tokenizer_json",
    "KEY_FORMATS",
]

logger = logging.getLogger(__name__)

#: ``auto`` picks ``token_id`` only when the tokenizer's WORD keys collide.
ExportKeyFormat = Literal["auto", "word", "token_id"]
KEY_FORMATS: tuple[str, ...] = ("auto", "word", "token_id")
#: Decoders whose single-id decode rewrites tokens so that distinct ids can share one key
#: (Metaspace ``▁hello`` -> ``hello``) or gain spaces (ByteLevel ``Ġhello`` -> `` hello``).
COLLIDING_DECODERS: tuple[str, ...] = ("Metaspace", "ByteLevel")


@dataclasses.dataclass
class ExportConfig(ArtifactConfig):
    """How a bundle was exported; saved as ``export_config.json`` inside the bundle.

    Args:
        model_dir: the ``SparseEncoder`` directory (or ``splade-tiny``) that was exported.
        name: model name registered in ML Commons.
        version: model version registered in ML Commons.
        prune: ``None`` or ``"max_ratio:<r>"`` with ``0 <= r < 1`` (neural-search's rule).
        key_format: ``auto`` (word unless single-id decodes collide), ``word`` or ``token_id``.
        idf_corpus: corpus file the IDF was computed from (BEIR ``corpus.jsonl`` or text lines).
        idf_json: an existing ``idf.json`` to ship instead (e.g. transferred with ``transfer_idf``).
        verify: run the conformance check after writing.
    """

    FILENAME = "export_config.json"

    model_dir: str = ""
    name: str | None = None
    version: str = "1.0.0"
    prune: str | None = None
    key_format: str = "auto"
    idf_corpus: str | None = None
    idf_json: str | None = None
    verify: bool = True

    def __post_init__(self) -> None:
        if self.key_format not in KEY_FORMATS:
            raise ValueError(f"key_format must be one of {', '.join(KEY_FORMATS)}, got {self.key_format!r}")
        parse_prune(self.prune)
        if self.idf_corpus and self.idf_json:
            raise ValueError("give either idf_corpus or idf_json, not both")
        if not str(self.version).strip():
            raise ValueError("version must be a non-empty string")


def parse_prune(prune: str | None) -> float | None:
    """The in-graph ``max_ratio`` of a prune spec: ``"max_ratio:0.1"`` -> ``0.1``; none -> ``None``.

    Only ``max_ratio`` can live in the graph (it needs no sorting); the spec is parsed and checked
    by :func:`opensearch_lsr.pruning.parse_prune` (neural-search ``PruneUtils`` rules).
    """
    config = parse_prune_spec(None if prune is None else str(prune).strip().lower())
    if config.prune_type == "none":
        return None
    if config.prune_type != "max_ratio":
        raise ValueError(f"prune must look like 'max_ratio:0.1' (only max_ratio is supported in the graph), got {prune!r}")
    return config.prune_ratio or None


# --------------------------------------------------------------------------- tokenizer side


def _decoder_types(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["type"]] if isinstance(node.get("type"), str) else []
        for value in node.values():
            found += _decoder_types(value)
        return found
    if isinstance(node, list):
        return [t for item in node for t in _decoder_types(item)]
    return []


def detect_key_collisions(tokenizer) -> dict[str, Any]:
    """Whether ML Commons' WORD keys (single-id decode) are ambiguous for this tokenizer.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (or a HF fast tokenizer).

    Returns:
        ``{"decoder", "risky_decoder", "duplicate_keys", "empty_keys", "examples", "collides"}``:
        a Metaspace/ByteLevel decoder, two non-special ids with the same decode, or a non-special
        id decoding to ``""`` (its weight would be silently dropped) all make WORD keys unsafe.
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    spec = json.loads(backend.to_str())
    decoders = _decoder_types(spec.get("decoder"))
    risky = sorted({d for d in decoders if d in COLLIDING_DECODERS})
    special = set(special_token_ids(backend))
    decoded = decode_keys(backend)
    seen: dict[str, int] = {}
    duplicates: list[tuple[int, int, str]] = []
    empty: list[int] = []
    for idx, key in enumerate(decoded):
        if idx in special:
            continue
        if key == "":
            empty.append(idx)
        elif key in seen:
            duplicates.append((seen[key], idx, key))
        else:
            seen[key] = idx
    examples = [f"ids {a} and {b} both decode to {k!r}" for a, b, k in duplicates[:5]]
    examples += [f"id {i} decodes to ''" for i in empty[:3]]
    return {
        "decoder": decoders[0] if decoders else None,
        "risky_decoder": risky,
        "duplicate_keys": len(duplicates),
        "empty_keys": len(empty),
        "examples": examples,
        "collides": bool(risky or duplicates or empty),
    }


def _max_length(hf_tokenizer, model_config, max_seq_length: int | None) -> int:
    """``min(tokenizer.model_max_length, usable position embeddings, encoder max_seq_length, 512)``."""
    limits = [MAX_LENGTH]
    mml = getattr(hf_tokenizer, "model_max_length", None)
    if isinstance(mml, int) and 0 < mml < 1_000_000:
        limits.append(mml)
    positions = getattr(model_config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        if getattr(model_config, "model_type", "") in {"roberta", "xlm-roberta", "camembert", "longformer"}:
            positions -= int(getattr(model_config, "pad_token_id", 1) or 0) + 1  # learned offset
        limits.append(positions)
    if max_seq_length:
        limits.append(int(max_seq_length))
    return min(limits)


def build_tokenizer_json(backend, max_length: int, pad_id: int, pad_token: str) -> str:
    """``tokenizer.json`` text with ML Commons' truncation block and DJL-style padding.

    Truncation ``{"direction":"Right","max_length":..,"strategy":"LongestFirst","stride":0}`` is
    what opensearch-py-ml writes (``_fill_null_truncation_field``); padding is ``BatchLongest``
    (DJL ``optPadding(true)``), which never pads a single document.
    """
    spec = json.loads(backend.to_str())
    spec["truncation"] = {"direction": "Right", "max_length": int(max_length), "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = {
        "strategy": "BatchLongest",
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": int(pad_id),
        "pad_type_id": 0,
        "pad_token": pad_token,
    }
    return json.dumps(spec, ensure_ascii=False, indent=2)


# --------------------------------------------------------------------------- model side


def resolve_key_format(backend: Any, key_format: ExportKeyFormat) -> tuple[str, dict[str, Any]]:
    """``(word | token_id, collision report)``: ``auto`` takes ``token_id`` when WORD keys collide,
    ``word`` refuses such a tokenizer (one sentence naming the colliding ids)."""
    collisions = detect_key_collisions(backend)
    if not collisions["collides"]:
        return ("word" if key_format == "auto" else key_format), collisions
    if key_format == "word":
        detail = "; ".join(collisions["examples"][:3]) or f"decoder {collisions['risky_decoder']}"
        raise ExportError("this tokenizer's single-id decode is ambiguous as ML Commons WORD keys "
                          f"({detail}); export with --key-format token_id (needs OpenSearch 3.2+) instead")
    return "token_id", collisions


def build_manifest(*, name: str, version: str, enc_zip: Path, pt_name: str, tok_zip: Path, backend: Any,
                   tok_bytes: bytes, key_format: str, max_length: int, special_ids: list[int], pooling: Any,
                   prune_ratio: float | None, idf: dict[str, float] | None, idf_source: str,
                   collisions: dict[str, Any], ts_facts: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``manifest.json``: hashes and sizes of both zips, vocabulary/tokenizer hashes, key format, limits,
    pooling, pruning, IDF source, TorchScript facts and library versions (the manifest step)."""
    import tokenizers
    import torch
    import transformers

    from .. import __version__ as toolkit_version

    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    vocab = [backend.id_to_token(i) for i in range(vocab_size)]
    manifest: dict[str, Any] = {
        "name": name,
        "version": version,
        "sparse_encoding": {
            "file": enc_zip.name,
            "sha256": sha256_file(enc_zip),
            "size_bytes": enc_zip.stat().st_size,
            "function_name": "SPARSE_ENCODING",
            "model_format": "TORCH_SCRIPT",
            "model_file": pt_name,
        },
        "sparse_tokenize": {
            "file": tok_zip.name,
            "sha256": sha256_file(tok_zip),
            "size_bytes": tok_zip.stat().st_size,
            "function_name": "SPARSE_TOKENIZE",
            "model_format": "TORCH_SCRIPT",
        },
        "vocab_size": vocab_size,
        "vocab_sha256": hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest(),
        "tokenizer_sha256": hashlib.sha256(tok_bytes).hexdigest(),
        "key_format": key_format,
        "min_opensearch_version": "3.2.0" if key_format == "token_id" else "2.11.0",
        "max_length": max_length,
        "special_token_ids": special_ids,
        "pooling": {"strategy": pooling.pooling_strategy, "activation": pooling.activation_function},
        "prune_type": "max_ratio" if prune_ratio else "none",
        "prune_ratio": prune_ratio,
        "idf": {"source": idf_source, "entries": len(idf) if idf is not None else 0},
        "key_collisions": collisions,
        "torchscript": ts_facts,
        # DJL loads one predictor per device of the ML node and warms each up: a graph with device
        # constants fails on the others (ml-commons DLModel.loadModel; contract 1.6). This toolkit's
        # trace has none (trace.SparseEncodingModule); a deploy on a GPU node has not been run.
        "ml_node_devices": ts_facts.get("devices") or ["any"],
        "toolkit_version": toolkit_version,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "export_seconds": round(seconds, 2),
    }
    return manifest


def resolve_query_idf(model_dir: str | os.PathLike, transformer: Any, backend: Any, static_idf: Any,
                      idf_corpus: str | None, idf_json: str | None) -> tuple[dict[str, float] | None, str]:
    """The ``idf.json`` of the query side and where it came from (the IDF step): a corpus, a given
    file, the model dir's ``idf.json``, a Router's static query weights, or none (ML Commons: 1.0)."""
    from ..transfer.surgery import resolve_model_path
    from ..corpus import iter_corpus_texts
    from ..idf import compute_idf, load_idf

    # an idf.json saved with the model (inference-free Router dirs keep it at their root)
    model_idf_file = next((c for c in (Path(resolve_model_path(str(model_dir))) / "idf.json",
                                       Path(str(transformer.auto_model.name_or_path or "")) / "idf.json")
                           if c.is_file()), None)
    if idf_corpus:
        return compute_idf(iter_corpus_texts(idf_corpus), backend), f"corpus:{idf_corpus}"
    if idf_json:
        return load_idf(idf_json), f"file:{idf_json}"
    if model_idf_file is not None:
        return load_idf(model_idf_file), f"file:{model_idf_file}"
    if static_idf is not None:
        from ..inference_free import idf_from_weights

        return idf_from_weights(backend, static_idf.weight), "router:SparseStaticEmbedding"
    return None, "none"


def _milco_key_format(head: Any, backend: Any, vocab_size: int, key_format: str) -> tuple[int, str, dict[str, Any]]:
    """``(output dim, "token_id", collisions)`` for a MILCO head. ML Commons' WORD keys decode every id through
    the zip's one tokenizer.json (``SparseEncodingTranslator.convertOutput``): the pivot ids (>= V_src) have no
    token there, so only TOKEN_ID (OpenSearch 3.2+, key = ``String.valueOf(idx)``) carries both views."""
    if head.source_vocab_size != vocab_size:
        raise ExportError(f"MILCO source view ({head.source_vocab_size} ids) and tokenizer ({vocab_size} ids) differ")
    if key_format == "word":
        raise ExportError("a MILCO model has two vocabularies (source view + English pivot view) that one "
                          "tokenizer.json cannot decode as WORD keys; export with --key-format token_id "
                          "(OpenSearch 3.2+)")
    return head.get_embedding_dimension(), "token_id", detect_key_collisions(backend)


def _trace_milco_zip(encoder: Any, tokenizer_text: str, out_zip: Path, model_name: str) -> tuple[str, dict[str, Any]]:
    """Trace the MILCO document encoder (:class:`~opensearch_lsr.multilingual.lexecho.MilcoEncodingModule`)
    with the recipe of :func:`~opensearch_lsr.opensearch.trace.trace_encoding_zip` and write ``out_zip``."""
    import tempfile

    import torch
    from tokenizers import Tokenizer

    from ..multilingual.lexecho import MilcoEncodingModule
    from .trace import WARM_UP_TEXT, _torchscript_facts, safe_name

    # traced in place (no weight copy), as float32 on CPU with eager attention; restored afterwards
    backbone, head = encoder[0].auto_model, encoder[1]
    param = next(backbone.parameters())
    dtype, device, training = param.dtype, param.device, encoder.training
    attn = getattr(backbone.config, "_attn_implementation", None)
    try:
        backbone.to("cpu").float().eval()
        head.to("cpu").float().eval()
        backbone.set_attn_implementation("eager")
        wrapper = MilcoEncodingModule(backbone, head).eval()
        runtime_tok = Tokenizer.from_str(tokenizer_text)
        runtime_tok.no_padding()
        example = runtime_tok.encode(WARM_UP_TEXT, add_special_tokens=True)
        example_input = {"input_ids": torch.tensor([example.ids], dtype=torch.int64),
                         "attention_mask": torch.tensor([example.attention_mask], dtype=torch.int64)}
        with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
            traced = torch.jit.trace(wrapper, (example_input,), strict=False, check_trace=False)
            pt_name = f"{safe_name(model_name)}.pt"
            torch.jit.save(traced, str(Path(tmp) / pt_name))
            facts = _torchscript_facts(Path(tmp) / pt_name, traced)
            del traced, wrapper
            write_zip(out_zip, {pt_name: Path(tmp) / pt_name, "tokenizer.json": tokenizer_text.encode("utf-8")})
    finally:
        if attn is not None and attn != "eager":
            backbone.set_attn_implementation(attn)
        if dtype != torch.float32 or device.type != "cpu":
            encoder.to(device=device, dtype=dtype)
        encoder.train(training)
    return pt_name, facts


def export_bundle(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    idf_corpus: str | None = None,
    prune: str | None = None,
    key_format: ExportKeyFormat = "auto",
    verify: bool = True,
    *,
    name: str | None = None,
    version: str = "1.0.0",
    idf_json: str | None = None,
    verify_texts: list[str] | None = None,
) -> dict[str, Any]:
    """Export ``model_dir`` to ``out_dir/{sparse_encoding.zip, sparse_tokenize.zip, manifest.json}``.

    Args:
        model_dir: ``SparseEncoder`` directory (MLM + SpladePooling, or a Router whose document
            route is one), or ``splade-tiny``.
        out_dir: bundle directory (created; existing bundle files are replaced).
        idf_corpus: corpus (BEIR ``corpus.jsonl``/dir or plain text, one doc per line) to compute
            ``idf.json`` from (:func:`opensearch_lsr.idf.compute_idf`). Without it the
            model dir's ``idf.json`` or a Router's static query weights are used if present;
            otherwise ML Commons weighs every query token 1.0.
        prune: ``"max_ratio:<r>"`` to prune inside the graph.
        key_format: ``auto`` picks ``token_id`` (OpenSearch 3.2+) when single-id decodes collide;
            ``word`` refuses such tokenizers.
        verify: run :func:`~opensearch_lsr.opensearch.conformance.verify_bundle` and refuse a bundle
            that does not reproduce the in-Python encoder within 1e-4.
        name, version: ML Commons model name/version (default: the model dir's name, ``1.0.0``).
        idf_json: ship this ``idf.json`` (e.g. from ``transfer_idf``).
        verify_texts: texts for the conformance check (default: a fixed English/Korean set).

    Returns:
        The manifest (also written to ``out_dir/manifest.json``).

    Raises:
        ExportError: bad input; ConformanceError: the exported zip does not conform.
    """
    from .conformance import ConformanceError, verify_bundle

    config = ExportConfig(model_dir=str(model_dir), name=name, version=version, prune=prune,
                          key_format=key_format, idf_corpus=idf_corpus, idf_json=idf_json, verify=verify)
    prune_ratio = parse_prune(prune)
    if idf_corpus and not os.path.exists(idf_corpus):
        raise ExportError(f"IDF corpus {idf_corpus!r} does not exist")
    if idf_json and not os.path.isfile(idf_json):
        raise ExportError(f"idf.json {idf_json!r} does not exist")
    started = time.perf_counter()
    encoder, transformer, pooling, static_idf = resolve_encoder(str(model_dir), allow_milco=True)
    hf_tok = transformer.tokenizer
    backend = getattr(hf_tok, "backend_tokenizer", None)
    if backend is None:
        raise ExportError(f"{str(model_dir)!r} has a slow tokenizer; ML Commons needs a fast one (tokenizer.json)")
    mlm = transformer.auto_model
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    milco = is_lexecho(pooling)
    if milco:
        out_features, resolved_format, collisions = _milco_key_format(pooling, backend, vocab_size, key_format)
    else:
        out_features = mlm.get_output_embeddings().weight.shape[0]
        if out_features != vocab_size:
            raise ExportError(
                f"model vocabulary ({out_features}) and tokenizer ({vocab_size} ids) differ; ML Commons needs them equal"
            )
        resolved_format, collisions = resolve_key_format(backend, key_format)
    special_ids = special_token_ids(hf_tok)
    max_length = _max_length(hf_tok, mlm.config, getattr(transformer, "max_seq_length", None))
    pad_id = hf_tok.pad_token_id if hf_tok.pad_token_id is not None else 0
    pad_token = hf_tok.pad_token or backend.id_to_token(pad_id) or "[PAD]"
    tokenizer_text = build_tokenizer_json(backend, max_length, pad_id, pad_token)

    model_name = name or Path(str(transformer.auto_model.name_or_path or model_dir)).name or "sparse-model"
    if str(model_dir) == "splade-tiny":
        model_name = name or "splade-tiny"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    # ---- trace step
    tok_bytes = tokenizer_text.encode("utf-8")
    enc_zip = out / "sparse_encoding.zip"
    if milco:
        if prune_ratio:
            raise ExportError("in-graph pruning is not implemented for MILCO; prune at ingest instead (create-pipeline / "
                              "index --prune alpha_mass:A, the paper's mass-based pruning)")
        pt_name, ts_facts = _trace_milco_zip(encoder, tokenizer_text, enc_zip, model_name)
    else:
        pt_name, ts_facts = trace_encoding_zip(mlm, tokenizer_text, enc_zip, model_name=model_name,
                                               vocab_size=vocab_size, special_ids=special_ids,
                                               pooling=pooling.pooling_strategy,
                                               activation=pooling.activation_function, prune_ratio=prune_ratio)
    if "aten::scaled_dot_product_attention" in ts_facts["ops"]:
        raise ExportError("the traced graph uses scaled_dot_product_attention; eager attention was not honoured")
    if ts_facts["file_format_version"] and ts_facts["file_format_version"] > TORCH_113_MAX_FILE_FORMAT:
        logger.warning("TorchScript file format %s is newer than torch 1.13 reads (%s): OpenSearch 2.x may refuse it",
                       ts_facts["file_format_version"], TORCH_113_MAX_FILE_FORMAT)

    # ---- IDF step: the query side (tokenizer + idf.json)
    idf, idf_source = resolve_query_idf(model_dir, transformer, backend, static_idf, idf_corpus, idf_json)
    tok_members: dict[str, Path | bytes] = {"tokenizer.json": tok_bytes}
    if idf is not None:
        tok_members["idf.json"] = json.dumps(idf, ensure_ascii=False).encode("utf-8")
    tok_zip = out / "sparse_tokenize.zip"
    write_zip(tok_zip, tok_members)

    # ---- manifest step
    manifest = build_manifest(
        name=model_name, version=str(version), enc_zip=enc_zip, pt_name=pt_name, tok_zip=tok_zip, backend=backend,
        tok_bytes=tok_bytes, key_format=resolved_format, max_length=max_length, special_ids=special_ids,
        pooling=pooling, prune_ratio=prune_ratio, idf=idf, idf_source=idf_source, collisions=collisions,
        ts_facts=ts_facts, seconds=time.perf_counter() - started)
    if milco:  # ids [0, V_src) source view, [V_src, V_src + V_en) English pivot view (multilingual.lexecho)
        manifest["output_dim"] = out_features
        manifest["views"] = {"source": [0, pooling.source_vocab_size], "pivot": [pooling.source_vocab_size, out_features],
                             "source_view": pooling.source_view}
    config.save(out)
    write_json(out / "manifest.json", manifest)
    # the conformance check loads the model twice more (TorchScript runtime + reference encoder)
    del encoder, transformer, mlm, pooling, static_idf
    if verify:
        t0 = time.perf_counter()
        report = verify_bundle(out, str(model_dir), list(verify_texts or DEFAULT_VERIFY_TEXTS))
        report["seconds"] = round(time.perf_counter() - t0, 2)
        manifest["conformance"] = report
        write_json(out / "manifest.json", manifest)
        if not report["passed"]:
            raise ConformanceError(
                f"the exported model does not reproduce the in-Python encoder (max weight diff "
                f"{report.get('max_abs_weight_diff')}, key mismatches {report.get('key_mismatches_above_atol')}, "
                f"layout {report['layout_problems']}); see {out / 'manifest.json'}"
            )
    return manifest
