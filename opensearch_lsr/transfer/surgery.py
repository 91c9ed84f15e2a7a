"""Model surgery: load a masked-LM sparse encoder, swap its vocabulary, save a ``SparseEncoder`` dir.

Every transfer method (SemBridge, VT, the baselines) only computes new input embeddings and a new
MLM output bias; this module is the one place that puts them into the model consistently: input
embeddings, the tied (or untied) MLM decoder, the decoder bias, the config's vocabulary size and
special-token ids, and the tokenizer saved next to it.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..resources import SPLADE_TINY, splade_tiny_path
from ..errors import LsrError

__all__ = [
    "TransferInputError",
    "MLMParts",
    "resolve_model_path",
    "load_source_model",
    "load_target_tokenizer",
    "mlm_parts",
    "swap_vocabulary",
    "save_sparse_encoder",
    "load_sparse_encoder",
]

logger = logging.getLogger(__name__)


class TransferInputError(LsrError, ValueError):
    """Bad user input (path, id, tokenizer, model type, parameter): one clear sentence for the CLI."""


def resolve_model_path(name_or_path: str) -> str:
    """Map the ``splade-tiny`` alias to its installed folder; keep local dirs and hub ids as given."""
    if name_or_path == SPLADE_TINY:
        return str(splade_tiny_path())
    return name_or_path


def _looks_like_local_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and not _looks_like_hub_id(name)


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _not_found_message(kind: str, name: str, err: Exception) -> str:
    if os.path.isdir(name):
        return f"{kind} directory {name!r} could not be loaded: {err}"
    if _looks_like_hub_id(name):
        return (
            f"{kind} {name!r} is neither a local directory nor reachable on the Hugging Face hub "
            f"(offline?): {type(err).__name__}"
        )
    return f"{kind} {name!r} does not exist (expected a local directory or a Hugging Face id)"


def load_source_model(name_or_path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a BERT/DistilBERT/RoBERTa-style masked-LM sparse encoder and its tokenizer.

    Accepts a local directory (plain HF or a sentence-transformers ``SparseEncoder`` dir, whose
    transformer lives at the root), a Hugging Face id, or the ``splade-tiny`` alias.

    Raises:
        TransferInputError: unknown path/id, or a model without a masked-LM head.
    """
    path = resolve_model_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - translated into one sentence for the user
        raise TransferInputError(_not_found_message("source model", name_or_path, err)) from err
    archs = config.architectures or []
    if archs and not any(a.endswith("ForMaskedLM") for a in archs):
        raise TransferInputError(
            f"source model {name_or_path!r} is a {archs[0]}, not a masked-LM sparse encoder "
            "(expected e.g. BertForMaskedLM, DistilBertForMaskedLM, RobertaForMaskedLM)"
        )
    try:
        model = AutoModelForMaskedLM.from_pretrained(path, attn_implementation="eager")
    except Exception as err:  # noqa: BLE001
        raise TransferInputError(f"source model {name_or_path!r} has no loadable masked-LM head: {err}") from err
    tokenizer = load_target_tokenizer(path, what="source tokenizer")
    if model.get_output_embeddings() is None:
        raise TransferInputError(f"source model {name_or_path!r} has no MLM output layer")
    model.eval()
    return model, tokenizer


def load_target_tokenizer(name_or_path: str, what: str = "target tokenizer") -> PreTrainedTokenizerBase:
    """Load a fast tokenizer (a local dir or a hub id); a slow one is converted to fast.

    OpenSearch needs ``tokenizer.json``, which only fast tokenizers write.
    """
    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True)
    except Exception as err:  # noqa: BLE001
        if os.path.isdir(path):
            raise TransferInputError(
                f"{what} directory {name_or_path!r} holds no usable tokenizer "
                f"(need tokenizer.json or vocab.txt + tokenizer_config.json): {type(err).__name__}: {err}"
            ) from err
        raise TransferInputError(_not_found_message(what, name_or_path, err)) from err
    if not getattr(tokenizer, "is_fast", False):
        raise TransferInputError(f"{what} {name_or_path!r} could not be converted to a fast tokenizer")
    if len(tokenizer.get_vocab()) == 0:
        raise TransferInputError(f"{what} {name_or_path!r} has an empty vocabulary")
    return tokenizer


@dataclass
class MLMParts:
    """Handles on the vocabulary-sized parameters of a masked LM."""

    input_embeddings: torch.nn.Embedding
    output_layer: torch.nn.Linear
    output_bias: torch.nn.Parameter | None
    tied: bool

    @property
    def vocab_size(self) -> int:
        return self.input_embeddings.weight.shape[0]


def mlm_parts(model: PreTrainedModel) -> MLMParts:
    """Find input embeddings, MLM decoder and decoder bias (BERT ``cls.predictions``, DistilBERT
    ``vocab_projector``, RoBERTa ``lm_head``: all exposed through ``get_output_embeddings``)."""
    emb = model.get_input_embeddings()
    out = model.get_output_embeddings()
    if emb is None or out is None:
        raise TransferInputError(f"{type(model).__name__} exposes no input embeddings / MLM decoder")
    bias = out.bias if getattr(out, "bias", None) is not None else None
    tied = out.weight.data_ptr() == emb.weight.data_ptr()
    return MLMParts(emb, out, bias, tied)


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id,
        "eos_token_id": tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id,
    }


@torch.no_grad()
def swap_vocabulary(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    input_embeddings: torch.Tensor,
    output_bias: torch.Tensor | None = None,
    output_embeddings: torch.Tensor | None = None,
) -> PreTrainedModel:
    """Give ``model`` the vocabulary of ``tokenizer``: new input embeddings, decoder and bias.

    Args:
        model: the source masked LM (modified in place and returned).
        tokenizer: the target tokenizer; ``len(tokenizer)`` must equal ``input_embeddings.shape[0]``.
        input_embeddings: ``[V_t, H]`` new input embedding matrix.
        output_bias: ``[V_t]`` new MLM decoder bias (required when the source decoder has one).
        output_embeddings: ``[V_t, H]`` new decoder weights for untied models (default: the
            input embeddings, i.e. the transfer of a tied model).
    """
    parts = mlm_parts(model)
    v_t, hidden = input_embeddings.shape
    if v_t != len(tokenizer):
        raise ValueError(f"{v_t} embedding rows for a tokenizer of {len(tokenizer)} tokens")
    if hidden != parts.input_embeddings.weight.shape[1]:
        raise ValueError(f"hidden size {hidden} != model hidden size {parts.input_embeddings.weight.shape[1]}")
    if parts.output_bias is not None and output_bias is None:
        raise ValueError("the source MLM decoder has a bias: pass output_bias")

    model.resize_token_embeddings(v_t, mean_resizing=False)
    parts_new = mlm_parts(model)
    dtype = parts_new.input_embeddings.weight.dtype
    parts_new.input_embeddings.weight.copy_(input_embeddings.to(dtype))
    if parts.tied:
        model.tie_weights()
    else:
        source = output_embeddings if output_embeddings is not None else input_embeddings
        parts_new.output_layer.weight.copy_(source.to(dtype))
    if output_bias is not None:
        if parts_new.output_bias is None or parts_new.output_bias.shape[0] != v_t:
            raise RuntimeError("resized MLM decoder has no bias of the new vocabulary size")
        parts_new.output_bias.copy_(output_bias.to(dtype))
    model.config.vocab_size = v_t
    keep_pad = _positions_count_from_pad(model)
    for key, value in _special_ids(tokenizer).items():
        if key == "pad_token_id" and keep_pad:
            if value != model.config.pad_token_id:
                logger.warning(
                    "%s counts position ids from the pad id: the config keeps the source pad id %s (positions "
                    "start at %s as in pre-training); target id %s (%r) is counted as padding there",
                    type(model).__name__, model.config.pad_token_id, model.config.pad_token_id + 1,
                    model.config.pad_token_id, tokenizer.convert_ids_to_tokens(model.config.pad_token_id))
            continue
        if value is not None and hasattr(model.config, key):
            setattr(model.config, key, value)
    return model


def _positions_count_from_pad(model: PreTrainedModel) -> bool:
    """Whether the embeddings derive position ids from the pad id (RoBERTa / XLM-R / CamemBERT:
    ``create_position_ids_from_input_ids`` numbers tokens from ``padding_idx + 1``). Re-pointing
    ``config.pad_token_id`` at a target pad with another id would shift every position by the difference
    when the model is reloaded (kobigbird [PAD] 0 vs XLM-R <pad> 1: all positions off by one)."""
    return any(hasattr(m, "create_position_ids_from_input_ids") and hasattr(m, "padding_idx")
               for m in model.modules())


def save_sparse_encoder(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | os.PathLike,
    max_seq_length: int = 512,
    pooling_strategy: str = "max",
    activation_function: str = "relu",
) -> Path:
    """Save ``model`` + ``tokenizer`` as a sentence-transformers ``SparseEncoder`` directory.

    Layout: the HF masked LM and ``tokenizer.json`` at the root (module 0, ``Transformer`` with
    ``transformer_task="fill-mask"``) and ``1_SpladePooling`` (max pooling of log(1+relu)).
    ``SparseEncoder(out_dir)`` loads it.
    """
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.model_max_length = min(int(tokenizer.model_max_length or max_seq_length), max_seq_length)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    transformer = Transformer(str(out), transformer_task="fill-mask", max_seq_length=max_seq_length)
    pooling = SpladePooling(
        pooling_strategy=pooling_strategy,
        activation_function=activation_function,
        embedding_dimension=len(tokenizer),
    )
    encoder = SparseEncoder(modules=[transformer, pooling], device="cpu")
    encoder.save(str(out))
    return out


def load_sparse_encoder(name_or_path: str, device: str | None = None):
    """Load a ``SparseEncoder`` directory (or the ``splade-tiny`` alias / a raw MLM dir / hub id).

    A directory without ``modules.json`` is wrapped as Transformer(fill-mask) + SpladePooling.
    """
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    path = resolve_model_path(name_or_path)
    try:
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, "modules.json")):
            transformer = Transformer(path, transformer_task="fill-mask", max_seq_length=512)
            vocab = transformer.auto_model.config.vocab_size
            pooling = SpladePooling(pooling_strategy="max", activation_function="relu", embedding_dimension=vocab)
            return SparseEncoder(modules=[transformer, pooling], device=device or "cpu")
        return SparseEncoder(path, device=device or "cpu", trust_remote_code=_own_module_classes(path))
    except Exception as err:  # noqa: BLE001 - missing weights, a bad config, no hub: one sentence
        raise TransferInputError(_not_found_message("sparse encoder", name_or_path, err)) from err


def _own_module_classes(path: str) -> bool:
    """True when ``modules.json`` names a class of this package (MILCO's ``LexEchoHead``) and otherwise only
    sentence-transformers classes: sentence-transformers >= 6.0 imports a class outside its namespace only
    with ``trust_remote_code=True`` (``util.misc.import_module_class``); nothing from the model dir runs."""
    modules = os.path.join(path, "modules.json")
    if not os.path.isfile(modules):
        return False
    import json

    with open(modules, encoding="utf-8") as fh:
        types = [str(m.get("type", "")) for m in json.load(fh)]
    own = [t for t in types if t.startswith("opensearch_lsr.")]
    return bool(own) and all(t.startswith(("sentence_transformers.", "opensearch_lsr.")) for t in types)
