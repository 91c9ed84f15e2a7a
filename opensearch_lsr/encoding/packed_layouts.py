"""From a Hugging Face masked LM to a packed one (:mod:`.packed`): which layouts are known, and their weights.

BERT, RoBERTa / XLM-R (positions start at ``padding_idx + 1``) and DistilBERT share the post-LN block of
:class:`~.packed.PackedMLM`; ModernBERT has its own (:mod:`.packed_modernbert`). Anything else (relative
positions, other families) gets ``None``, and the encoder runs padded batches. Module and attribute names are
those of transformers' ``modeling_bert``, ``modeling_roberta``, ``modeling_xlm_roberta``, ``modeling_distilbert``
and ``modeling_modernbert`` (5.x).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .packed import PackedMLM, PostLNBlock, cast_weight, default_compile_scope, head_transform, layer_norm_params
from .packed_modernbert import packed_modernbert

__all__ = ["default_head_dtype", "packed_model"]


def _bert_layer(layer: Any, dtype: torch.dtype) -> PostLNBlock:
    att, c = layer.attention, cast_weight
    q, k, v = att.self.query, att.self.key, att.self.value
    return PostLNBlock(
        c(torch.cat([q.weight, k.weight, v.weight]), dtype), c(torch.cat([q.bias, k.bias, v.bias]), dtype),
        c(att.output.dense.weight, dtype), c(att.output.dense.bias, dtype), layer_norm_params(att.output.LayerNorm),
        c(layer.intermediate.dense.weight, dtype), c(layer.intermediate.dense.bias, dtype),
        layer.intermediate.intermediate_act_fn, c(layer.output.dense.weight, dtype), c(layer.output.dense.bias, dtype),
        layer_norm_params(layer.output.LayerNorm))


def _distilbert_layer(layer: Any, dtype: torch.dtype) -> PostLNBlock:
    att, ffn, c = layer.attention, layer.ffn, cast_weight
    return PostLNBlock(
        c(torch.cat([att.q_lin.weight, att.k_lin.weight, att.v_lin.weight]), dtype),
        c(torch.cat([att.q_lin.bias, att.k_lin.bias, att.v_lin.bias]), dtype),
        c(att.out_lin.weight, dtype), c(att.out_lin.bias, dtype), layer_norm_params(layer.sa_layer_norm),
        c(ffn.lin1.weight, dtype), c(ffn.lin1.bias, dtype), ffn.activation,
        c(ffn.lin2.weight, dtype), c(ffn.lin2.bias, dtype), layer_norm_params(layer.output_layer_norm))


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def default_head_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The MLM head's dtype (transform and decoder) beside a body in ``dtype``: fp16 beside bf16 on CUDA, else
    ``dtype``.

    Which ids a document keeps is the sign of its largest logit, so the ids near zero are decided by the head's
    rounding. fp16 keeps 3 more significant bits than bf16 at the same tensor-core rate (H100 / H200), and the
    head cannot overflow it: its input is a LayerNorm output and its logits are tens at most. Against fp32 on
    the Korean passages (``benchmarks/precision_distance.py``, 2-core CPU; active-set Jaccard / max |dw|):
    SPLADE-tiny 0.979 / 0.086 with a bf16 head, 0.991 / 0.042 with an fp16 one; ``gpu_encode.py``'s
    BERT-base-shaped model 0.971 / 0.020 and 0.984 / 0.013 (its twelve bf16 layers keep the rest; fp16
    throughout: 0.997 and 0.995). The CPU has no fast fp16 matmul, so there the head stays in ``dtype``."""
    return torch.float16 if dtype == torch.bfloat16 and device.type == "cuda" else dtype


def packed_model(model: Any, dtype: torch.dtype, *, vocab_chunk: int, segment_max: str = "reduce",
                 row_block: int | None = None, compile: bool | str | None = None,
                 head_dtype: torch.dtype | None = None) -> PackedMLM | None:
    """A :class:`PackedMLM` over ``model``'s weights (cast once to ``dtype``), or ``None`` when the layout is
    not one this module knows (absolute positions, post-LN blocks, the families named in the module doc).
    ``compile``: what to fuse, as :class:`PackedMLM` takes it (``None``: :func:`.packed.default_compile_scope`).
    ``head_dtype``: the MLM head's (transform and decoder) dtype, ``dtype`` by default."""
    head_dtype = head_dtype or dtype
    kind = type(model).__name__
    cfg = model.config
    if getattr(cfg, "position_embedding_type", "absolute") not in (None, "absolute"):
        return None
    with torch.no_grad():
        if kind in ("BertForMaskedLM", "RobertaForMaskedLM", "XLMRobertaForMaskedLM"):
            base = model.bert if kind == "BertForMaskedLM" else model.roberta
            emb = base.embeddings
            if kind == "BertForMaskedLM":
                pred = model.cls.predictions
                t = pred.transform
                transform = head_transform(t.dense, t.transform_act_fn, t.LayerNorm, head_dtype)
                dec = pred.decoder
                bias = dec.bias if dec.bias is not None else getattr(pred, "bias", None)
                offset = 0
            else:
                head = model.lm_head
                transform = head_transform(head.dense, _gelu, head.layer_norm, head_dtype)
                dec = head.decoder
                bias = dec.bias if dec.bias is not None else head.bias
                offset = int(cfg.pad_token_id) + 1  # RobertaEmbeddings.create_position_ids_from_input_ids
            token_type = emb.token_type_embeddings.weight[0].detach().float() if hasattr(
                emb, "token_type_embeddings") else None
            layers = [_bert_layer(layer, dtype) for layer in base.encoder.layer]
            heads = int(cfg.num_attention_heads)
        elif kind == "DistilBertForMaskedLM":
            emb = model.distilbert.embeddings
            transform = head_transform(model.vocab_transform, model.activation, model.vocab_layer_norm, head_dtype)
            dec, bias, offset, token_type = model.vocab_projector, model.vocab_projector.bias, 0, None
            layers = [_distilbert_layer(layer, dtype) for layer in model.distilbert.transformer.layer]
            heads = int(cfg.n_heads)
        elif kind == "ModernBertForMaskedLM":
            return packed_modernbert(model, dtype, vocab_chunk=vocab_chunk, segment_max=segment_max,
                                     row_block=row_block, head_dtype=head_dtype)
        else:
            return None
        word, position, emb_ln = emb.word_embeddings.weight, emb.position_embeddings.weight, layer_norm_params(
            emb.LayerNorm)
        return PackedMLM(word=word.detach().float(), position=position.detach().float(), token_type=token_type,
                         emb_ln=emb_ln, position_offset=offset, heads=heads, layers=layers, transform=transform,
                         decoder_w=cast_weight(dec.weight, head_dtype), decoder_b=cast_weight(bias, head_dtype),
                         dtype=dtype, vocab_chunk=int(vocab_chunk), segment_max=segment_max, row_block=row_block,
                         compile=default_compile_scope(word.device, dtype) if compile is None else compile)
