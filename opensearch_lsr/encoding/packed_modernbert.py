"""ModernBERT (Warner et al. 2024) over packed documents: its own block layout on :class:`~.packed.PackedMLM`.

ModernBERT differs from the BERT family in every block, so the body here is its own:
- pre-LayerNorm residual blocks (the first block has no attention norm);
- a fused ``Wqkv`` and rotary positions (one RoPE table per layer type);
- alternating global and local attention. A local layer sees keys within ``local_attention // 2`` positions
  on either side (transformers' ``sliding_window_bidirectional_overlay``: ``|i - j| <= window``), which is
  ``window_size=(w, w)`` of the varlen kernel or a band mask on the padded SDPA view;
- a GeGLU MLP (``act(input) * gate``);
- a final norm before the prediction head.

The vocabulary head and the segment max are :class:`~.packed.PackedMLM`'s. Layout read from transformers
``models/modernbert/modeling_modernbert.py`` (5.x).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F

from .packed import PackedMLM, Segments, cast_weight, head_transform, layer_norm_params, padded_attention

__all__ = ["PackedModernBert", "packed_modernbert"]


class _Block(NamedTuple):
    attn_norm: tuple[torch.Tensor, torch.Tensor, float] | None
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    out_w: torch.Tensor
    out_b: torch.Tensor | None
    mlp_norm: tuple[torch.Tensor, torch.Tensor, float]
    wi_w: torch.Tensor
    wi_b: torch.Tensor | None
    act: Callable[[torch.Tensor], torch.Tensor]
    wo_w: torch.Tensor
    wo_b: torch.Tensor | None
    layer_type: str
    window: int | None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PackedModernBert(PackedMLM):
    """A ModernBERT masked LM over packed documents (built by :func:`packed_modernbert`)."""

    def __init__(self, *, blocks: list[_Block], final_norm: tuple, inv_freq: dict[str, torch.Tensor],
                 **kwargs: Any) -> None:
        super().__init__(layers=[], **kwargs)
        self.blocks, self.final_norm, self.inv_freq = blocks, final_norm, inv_freq

    def _rope(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        out = {}
        for layer_type, inv_freq in self.inv_freq.items():
            freqs = positions[:, None].float() * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
            out[layer_type] = (emb.cos(), emb.sin())
        return out

    def _attend_window(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segments,
                       window: int | None) -> torch.Tensor:
        if window is None:
            return self._attend(q, k, v, seg)
        if self.use_varlen:
            try:
                return self._varlen(q, k, v, seg.cu_seqlens, seg.cu_seqlens, seg.max_len, seg.max_len,
                                    window_size=(window, window))
            except (RuntimeError, TypeError, NotImplementedError):  # a torch without windows: the padded view
                pass
        return padded_attention(q, k, v, seg, window=window)

    def hidden(self, ids: torch.Tensor, seg: Segments) -> torch.Tensor:
        dt = self.dtype
        x = F.embedding(ids, self.word).float()
        x = F.layer_norm(x, x.shape[-1:], *self.emb_ln[:2], self.emb_ln[2])
        total, width = x.shape
        head_dim = width // self.heads
        rope = self._rope(seg.positions)
        for block in self.blocks:
            h = x if block.attn_norm is None else F.layer_norm(x, (width,), *block.attn_norm[:2], block.attn_norm[2])
            qkv = F.linear(h.to(dt), block.qkv_w, block.qkv_b).view(total, 3, self.heads, head_dim)
            cos, sin = rope[block.layer_type]
            q, k = (((t.float() * cos) + _rotate_half(t.float()) * sin).to(dt) for t in (qkv[:, 0], qkv[:, 1]))
            ctx = self._attend_window(q, k, qkv[:, 2], seg, block.window).reshape(total, width)
            x = x + F.linear(ctx, block.out_w, block.out_b)
            h = F.layer_norm(x, (width,), *block.mlp_norm[:2], block.mlp_norm[2]).to(dt)
            up, gate = F.linear(h, block.wi_w, block.wi_b).chunk(2, dim=-1)
            x = x + F.linear(block.act(up) * gate, block.wo_w, block.wo_b)
        return self.transform(F.layer_norm(x, (width,), *self.final_norm[:2], self.final_norm[2]))


def packed_modernbert(model: Any, dtype: torch.dtype, *, vocab_chunk: int, segment_max: str = "reduce",
                      row_block: int | None = None, head_dtype: torch.dtype | None = None) -> PackedModernBert | None:
    """A :class:`PackedModernBert` over a ``ModernBertForMaskedLM``'s weights, or ``None`` where its rotary
    setting is not the default RoPE (scaled variants are left to the padded path); the head in ``head_dtype``
    (``dtype`` by default)."""
    head_dtype = head_dtype or dtype
    cfg, base = model.config, model.model
    rope_params = getattr(cfg, "rope_parameters", None) or {}
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    inv_freq = {}
    for layer_type in set(cfg.layer_types):
        params = rope_params.get(layer_type) or {}
        if params.get("rope_type", "default") != "default" or "rope_theta" not in params:
            return None
        inv_freq[layer_type] = (1.0 / (params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float)
                                                                / head_dim))).to(model.device)
    window = int(cfg.local_attention) // 2
    blocks, c = [], cast_weight
    with torch.no_grad():
        for layer in base.layers:
            attn, mlp = layer.attn, layer.mlp
            blocks.append(_Block(
                None if isinstance(layer.attn_norm, torch.nn.Identity) else layer_norm_params(layer.attn_norm),
                c(attn.Wqkv.weight, dtype), c(attn.Wqkv.bias, dtype),
                c(attn.Wo.weight, dtype), c(attn.Wo.bias, dtype), layer_norm_params(layer.mlp_norm),
                c(mlp.Wi.weight, dtype), c(mlp.Wi.bias, dtype), mlp.act,
                c(mlp.Wo.weight, dtype), c(mlp.Wo.bias, dtype), layer.attention_type,
                window if layer.attention_type == "sliding_attention" else None))
        head = model.head
        transform = head_transform(head.dense, head.act, head.norm, head_dtype)
        emb = base.embeddings
        return PackedModernBert(
            blocks=blocks, final_norm=layer_norm_params(base.final_norm), inv_freq=inv_freq,
            word=emb.tok_embeddings.weight.detach().float(), position=torch.zeros(1, 1), token_type=None,
            emb_ln=layer_norm_params(emb.norm), position_offset=0, heads=int(cfg.num_attention_heads),
            transform=transform, decoder_w=cast_weight(model.decoder.weight, head_dtype),
            decoder_b=cast_weight(model.decoder.bias, head_dtype), dtype=dtype, vocab_chunk=int(vocab_chunk),
            segment_max=segment_max, row_block=row_block)

