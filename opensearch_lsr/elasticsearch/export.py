"""Export a ``SparseEncoder`` directory as an Elasticsearch ``text_expansion`` trained model.

The artifact is what eland's ``eland_import_hub_model --task-type text_expansion`` produces
(elastic/eland ``eland/ml/pytorch/transformers.py``: ``TransformerModel.save`` ->
``traced_pytorch_model.pt`` + ``vocabulary.json`` + the ``NlpTrainedModelConfig`` body), written
to ``<out>/elasticsearch/``:

* ``traced_pytorch_model.pt``: TorchScript with eland's BERT calling convention, four positional
  int64 tensors ``(input_ids, attention_mask, token_type_ids, position_ids)``, returning
  ``[batch, V]`` float32: SPLADE max pooling of ``log(1 + relu(logits))`` over unmasked positions
  (Formal et al. 2021, SPLADE v2, arXiv:2109.10086), special-token ids zeroed;
* ``config.json``: the ``PUT _ml/trained_models/<id>`` body (``model_type: pytorch``,
  ``inference_config.text_expansion.tokenization.bert`` with the tokenizer's ``do_lower_case``,
  ``max_sequence_length`` 512, ``truncate: first``; ``input.field_names: ["text_field"]``;
  eland's memory metadata);
* ``vocabulary.json``: ``{"vocabulary": [...]}`` in id order (eland ``_load_vocab``);
* ``manifest.json``: sizes, sha256, content hash, graph operations, tokenizer comparison.

Why not eland itself (it is the reference and the optional ``eland`` extra): its traced
``text_expansion`` model is the raw ``AutoModelForMaskedLM`` (``[batch, seq, V]`` logits) and
Elasticsearch reads only position 0 of that (``TextExpansionProcessor``), so a SPLADE model loses
its pooling (elastic/eland#827); its ``pytorch`` extra pins torch 2.7.1 / transformers < 5 and its
module imports ``transformers.RetriBertTokenizer``, which transformers 5 removed; and it loads
from a hub id or directory with the slow tokenizer, not from our transferred SparseEncoder.
The graph is kept within ml-cpp's operation allow-list (released in v8.19.20 / v9.4.0;
:data:`~opensearch_lsr.elasticsearch.runtime.ALLOWED_OPERATIONS`): ``log1p`` is written as ``log(x + 1)``
because ``aten::log1p`` is not on it; max pooling is ``-min(-x)`` (``aten::max`` is on the released lists,
``-min(-x)`` gives the same graph on every release).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from ..config import ArtifactConfig, sha256_file, write_json
from ..contract import special_token_ids
from ..errors import LsrError
from .keys import key_collisions
from .runtime import EsConformanceError, graph_operations, disallowed_operations

__all__ = ["EsExportConfig", "EsExportError", "export_elasticsearch", "es_model_id", "TextExpansionModule",
           "ES_DIR", "MAX_SEQUENCE_LENGTH"]

logger = logging.getLogger(__name__)

ES_DIR = "elasticsearch"
MAX_SEQUENCE_LENGTH = 512
_MODEL_ID = re.compile(r"^[a-z0-9](?:[a-z0-9_\-.]*[a-z0-9])?$")


class EsExportError(LsrError, ValueError):
    """Bad export input for Elasticsearch (not a BERT WordPiece model, vocabulary mismatch ...)."""


def es_model_id(name: str) -> str:
    """A valid trained-model id from a name: lowercase, ``[a-z0-9_-.]``, alphanumeric ends, <= 64 chars.

    Same folding as eland's ``elasticsearch_model_id`` (``/`` -> ``__``, lower-cased).
    """
    mid = re.sub(r"[^a-z0-9_\-.]+", "_", name.replace("/", "__").lower()).strip("_-.")[:64].strip("_-.")
    if not mid or not _MODEL_ID.match(mid):
        raise EsExportError(f"cannot make an Elasticsearch model id from {name!r}")
    return mid


@dataclasses.dataclass
class EsExportConfig(ArtifactConfig):
    """How the Elasticsearch artifact was exported (saved next to it)."""

    FILENAME = "es_export_config.json"

    model_dir: str = ""
    model_id: str | None = None
    max_sequence_length: int = MAX_SEQUENCE_LENGTH
    verify: bool = True

    def __post_init__(self) -> None:
        if not 8 <= int(self.max_sequence_length) <= MAX_SEQUENCE_LENGTH:
            raise ValueError(f"max_sequence_length must be in [8, {MAX_SEQUENCE_LENGTH}], got {self.max_sequence_length}")
        if self.model_id is not None and not _MODEL_ID.match(self.model_id):
            raise ValueError(f"model_id {self.model_id!r} must be lowercase letters, digits, '-', '_' or '.', "
                             "starting and ending with a letter or digit")


def _module_class():
    import torch

    class TextExpansionModule(torch.nn.Module):
        """Masked LM + SPLADE max pooling, called as ml-cpp calls a BERT model."""

        def __init__(self, mlm, vocab_size: int, special_ids: list[int]) -> None:
            super().__init__()
            self.mlm = mlm
            keep = torch.ones(vocab_size, dtype=torch.float32)
            if special_ids:
                keep[torch.tensor(sorted(special_ids), dtype=torch.long)] = 0.0
            self.register_buffer("keep", keep)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                    position_ids: torch.Tensor) -> torch.Tensor:
            logits = self.mlm(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              position_ids=position_ids, return_dict=False)[0]
            mask = attention_mask.unsqueeze(-1).to(logits.dtype)
            values = torch.log(torch.relu(logits) * mask + 1.0)  # log1p(relu(masked logits))
            pooled = torch.neg(torch.min(torch.neg(values), dim=1)[0])  # max over the sequence
            return (pooled * self.keep).to(torch.float32)

    return TextExpansionModule


def __getattr__(name: str):
    if name == "TextExpansionModule":  # built lazily: importing this module does not import torch
        return _module_class()
    raise AttributeError(name)


def _bert_settings(hf_tok, backend) -> dict[str, Any]:
    """``do_lower_case`` / strip-accents of the fast tokenizer, refusing what ES's ``bert`` cannot mirror."""
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "WordPiece":
        raise EsExportError(f"Elasticsearch's bert tokenization needs a WordPiece vocabulary, this one is {model.get('type')}")
    if model.get("continuing_subword_prefix", "##") != "##":
        raise EsExportError("the WordPiece continuation prefix must be '##' for Elasticsearch")
    norm = spec.get("normalizer") or {}
    pre = spec.get("pre_tokenizer") or {}
    # Elasticsearch always cleans control characters, splits CJK ideographs and punctuation (BasicTokenFilter)
    if norm.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer":
        raise EsExportError(f"the tokenizer must use BertNormalizer + BertPreTokenizer to match Elasticsearch's bert "
                            f"tokenization, got {norm.get('type')} + {pre.get('type')}")
    if norm.get("clean_text") is False or norm.get("handle_chinese_chars") is False:
        raise EsExportError("Elasticsearch always strips control characters and splits CJK ideographs; this tokenizer "
                            "turns clean_text or handle_chinese_chars off, so the ids would differ")
    lower = bool(norm.get("lowercase", getattr(hf_tok, "do_lower_case", False)))
    strip = norm.get("strip_accents")
    if strip is not None and bool(strip) != lower:
        raise EsExportError("strip_accents differs from lowercase; Elasticsearch ties them (do_strip_accents "
                            "defaults to do_lower_case) and this export does not set it separately")
    for token in ("[UNK]", "[PAD]", "[CLS]", "[SEP]"):
        if backend.token_to_id(token) is None:
            raise EsExportError(f"the vocabulary has no {token}; Elasticsearch's bert tokenizer requires it")
    return {"do_lower_case": lower}


def _file_format_version(pt_path: Path) -> int | None:
    """The archive's ``.data/version`` (TorchScript file format) that the loading libtorch must support."""
    import zipfile

    with zipfile.ZipFile(pt_path) as zf:
        entry = next((n for n in zf.namelist() if n.endswith("/.data/version") or n.endswith("/version")), None)
        return int(zf.read(entry).decode().strip()) if entry else None


def _content_hash(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.name.encode())
        digest.update(bytes.fromhex(sha256_file(p)))
    return digest.hexdigest()


def export_elasticsearch(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    model_id: str | None = None,
    max_sequence_length: int = MAX_SEQUENCE_LENGTH,
    verify: bool = True,
    verify_texts: list[str] | None = None,
) -> dict[str, Any]:
    """Write ``<out_dir>/elasticsearch/`` for ``model_dir`` and return its manifest.

    Args:
        model_dir: ``SparseEncoder`` directory (MLM + SpladePooling, or a Router's document route) or ``splade-tiny``.
        out_dir: bundle directory (shared with the OpenSearch export; ``--target both``).
        model_id: Elasticsearch trained-model id (default: from the model name).
        max_sequence_length: ``tokenization.bert.max_sequence_length`` (<= 512).
        verify: run :func:`~opensearch_lsr.elasticsearch.conformance.verify_export` and refuse a non-conforming artifact.
        verify_texts: texts for the check (default: the OpenSearch export's English/Korean set).

    Raises:
        EsExportError: bad input; EsConformanceError: the artifact does not conform.
    """
    import copy

    import torch

    from .. import __version__ as toolkit_version
    from ..engines.export_core import DEFAULT_VERIFY_TEXTS, ExportError, resolve_encoder

    config = EsExportConfig(model_dir=str(model_dir), model_id=model_id, max_sequence_length=max_sequence_length,
                            verify=verify)
    started = time.perf_counter()
    try:
        _encoder, transformer, _pooling, _idf = resolve_encoder(str(model_dir))
    except ExportError as err:
        raise EsExportError(str(err)) from err
    if _pooling.pooling_strategy != "max" or _pooling.activation_function != "relu":
        raise EsExportError(f"only max pooling of relu activations is exported (got {_pooling.pooling_strategy}/"
                            f"{_pooling.activation_function})")
    hf_tok = transformer.tokenizer
    backend = getattr(hf_tok, "backend_tokenizer", None)
    if backend is None:
        raise EsExportError(f"{str(model_dir)!r} has a slow tokenizer; the export needs tokenizer.json")
    mlm = transformer.auto_model
    if getattr(mlm.config, "model_type", "") != "bert":
        raise EsExportError(f"only BERT masked LMs map onto Elasticsearch's bert tokenization and argument order, "
                            f"got {mlm.config.model_type!r}")
    settings = _bert_settings(hf_tok, backend)
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    if mlm.get_output_embeddings().weight.shape[0] != vocab_size:
        raise EsExportError("model vocabulary and tokenizer sizes differ")
    vocabulary = [backend.id_to_token(i) for i in range(vocab_size)]
    # the ids the OpenSearch export zeroes too: HF special ids + tokenizer.json's special added tokens
    special_ids = special_token_ids(hf_tok)
    name = Path(str(mlm.name_or_path or model_dir)).name or "sparse-model"
    if str(model_dir) == "splade-tiny":
        name = "splade-tiny"
    mid = model_id or es_model_id(f"lsr-{name}")
    out = Path(out_dir) / ES_DIR
    out.mkdir(parents=True, exist_ok=True)

    mlm_export = copy.deepcopy(mlm).to("cpu").float().eval()
    mlm_export.set_attn_implementation("eager")
    wrapper = _module_class()(mlm_export, vocab_size, special_ids).eval()
    ids = [backend.token_to_id("[CLS]")] + backend.encode("This is an example sentence. 서울", add_special_tokens=False).ids
    ids = ids + [backend.token_to_id("[SEP]")]
    n = len(ids)
    example = (torch.tensor([ids, ids[:-2] + [0, 0]], dtype=torch.int64),
               torch.tensor([[1] * n, [1] * (n - 2) + [0, 0]], dtype=torch.int64),
               torch.zeros(2, n, dtype=torch.int64), torch.arange(n, dtype=torch.int64).repeat(2, 1))
    pt_path = out / "traced_pytorch_model.pt"
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        traced = torch.jit.trace(wrapper, example, check_trace=False)
        tmp_pt = Path(tmp) / pt_path.name
        torch.jit.save(traced, str(tmp_pt))
        os.replace(tmp_pt, pt_path)
    ops = graph_operations(traced)
    file_format = _file_format_version(pt_path)
    if file_format is not None and file_format > 10:  # torch 1.13-2.x read <= 0xA (caffe2/serialize/versions.h)
        logger.warning("TorchScript file format %s may be newer than the libtorch of the Elasticsearch release", file_format)
    bad_ops = disallowed_operations(ops)
    if bad_ops:
        logger.warning("graph operations outside ml-cpp's allow-list: %s", ", ".join(bad_ops))

    inference_config = {"text_expansion": {"tokenization": {"bert": {
        "do_lower_case": settings["do_lower_case"], "with_special_tokens": True,
        "max_sequence_length": int(max_sequence_length), "truncate": "first"}}}}
    params = sum(p.numel() * p.element_size() for p in wrapper.parameters())
    buffers = sum(b.numel() * b.element_size() for b in wrapper.buffers())
    body = {
        "description": f"Learned-sparse (SPLADE) model {name} for task type 'text_expansion' (opensearch-lsr)",
        "model_type": "pytorch",
        "inference_config": inference_config,
        "input": {"field_names": ["text_field"]},
        # eland's metadata keys (eland measures the allocation memory by profiling a forward pass; here it is an
        # estimate of one max-length forward: 3 float32 [seq, V] tensors (logits, relu*mask, log) + hidden
        # states and attention maps)
        "metadata": {"per_deployment_memory_bytes": int(params + buffers),
                     "per_allocation_memory_bytes": int(4 * max_sequence_length * (
                         3 * vocab_size + 12 * mlm.config.hidden_size
                         + mlm.config.num_attention_heads * max_sequence_length))},
    }
    write_json(out / "config.json", body)
    write_json(out / "vocabulary.json", {"vocabulary": vocabulary})
    files = [pt_path, out / "config.json", out / "vocabulary.json"]
    collisions = key_collisions(vocabulary)
    if collisions:
        # TextExpansionResults.asMap collects the tokens with Collectors.toMap, which has no merge rule: a text
        # whose expansion holds both ids fails the ingest `inference` processor with "Duplicate key"
        logger.warning("%d vocabulary entries share an Elasticsearch key after '.' -> '__' (e.g. ids %s and %s -> %r): "
                       "the ingest pipeline fails with 'Duplicate key' on any text that activates both; bulk-loaded "
                       "vectors merge them by max", len(collisions), collisions[0][0], collisions[0][1], collisions[0][2])
    manifest: dict[str, Any] = {
        "model_id": mid,
        "task_type": "text_expansion",
        "definition": {"file": pt_path.name, "size_bytes": pt_path.stat().st_size, "sha256": sha256_file(pt_path)},
        "config": {"file": "config.json", "sha256": sha256_file(out / "config.json")},
        "vocabulary": {"file": "vocabulary.json", "size": vocab_size, "sha256": sha256_file(out / "vocabulary.json")},
        "content_hash": _content_hash(files),
        "special_token_ids": special_ids,
        "do_lower_case": settings["do_lower_case"],
        "max_sequence_length": int(max_sequence_length),
        "key_rule": "vocabulary[id] with '.' -> '__' (TextExpansionProcessor.buildSanitizedVocabMap)",
        "key_collisions": [{"ids": [a, b], "key": k} for a, b, k in collisions[:20]],
        "graph_operations": ops,
        "torchscript_file_format": file_format,
        "disallowed_operations": bad_ops,
        # 8.15: the sparse_vector query (SparseVectorQueryBuilder.getMinimalSupportedVersion V_8_15_0); 8.11-8.12
        # also ship libtorch 1.13.1, which cannot read this TorchScript's file format
        "min_elasticsearch_version": "8.15.0",
        "toolkit_version": toolkit_version,
        "torch_version": torch.__version__,
    }
    config.save(out)
    write_json(out / "manifest.json", manifest)
    if verify:
        from .conformance import verify_export

        t0 = time.perf_counter()
        report = verify_export(out, str(model_dir), list(verify_texts or DEFAULT_VERIFY_TEXTS))
        report["seconds"] = round(time.perf_counter() - t0, 2)
        manifest["conformance"] = report
        write_json(out / "manifest.json", manifest)
        if not report["passed"]:
            raise EsConformanceError(
                f"the exported Elasticsearch model does not conform (max weight diff {report.get('max_abs_weight_diff')}, "
                f"key mismatches {report.get('key_mismatches')}, tokenizer differences "
                f"{report['tokenizer']['texts'] - report['tokenizer']['identical']}, disallowed ops {bad_ops}); "
                f"see {out / 'manifest.json'}")
    manifest["export_seconds"] = round(time.perf_counter() - started, 2)
    write_json(out / "manifest.json", manifest)
    return manifest
