"""Fused MLM decoder + SPLADE max pooling: the same numbers, without the ``[batch, seq, vocab]`` tensor.

SPLADE (Formal et al. 2021, "SPLADE v2") scores a text as ``w_j = max_i log(1 + relu(z_ij))`` where
``z = H W^T + b`` are the masked-LM logits of every position ``i``. sentence-transformers computes
``z`` in full (``Transformer(fill-mask)``) and pools it in ``SpladePooling``; on a CPU with a 30k-vocab
head that ``[B, L, V]`` tensor (500 MB for 32 x 128 x 30,522) and its five elementwise passes forward
and backward cost ~25 s per batch, most of a training step. No library ships a memory-lean version,
so it is written here:

* ``log1p`` and ``relu`` are monotone, so ``max_i log1p(relu(z_ij)) = log1p(relu(max_i z_ij))``:
  the forward pass only needs the running max (and its argmax) of ``z`` over valid positions, computed
  in vocabulary chunks so the full logits never exist.
* The gradient of a max flows only to its argmax, and only where ``max_i z_ij > 0``; the backward
  pass gathers those ``(b, j)`` pairs and scatters into ``H``, ``W`` and ``b`` (sparse, cheap).

:func:`fused_splade` patches the ``Transformer(fill-mask)`` + ``SpladePooling`` pairs of a
``SparseEncoder`` (also inside a ``Router``) in place, for training and evaluation, and restores them
afterwards. Parameters, ``state_dict`` and the saved directory layout are untouched, so checkpoints
remain ordinary ``SparseEncoder`` directories.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

__all__ = ["splade_max_pool", "fused_splade", "find_splade_pairs"]

logger = logging.getLogger(__name__)

#: Elements per chunk of logits ``[B, L, C]`` materialised at once (~64 MB of float32).
_CHUNK_ELEMENTS = 16_000_000


def _activation(raw: torch.Tensor, double_log: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``f(relu(raw))`` and ``f'(raw)`` for ``f = log1p`` (or ``log1p . log1p``)."""
    pos = raw.clamp_min(0)
    out = torch.log1p(pos)
    grad = (raw > 0).to(raw.dtype) / (1.0 + pos)
    if double_log:
        grad = grad / (1.0 + out)
        out = torch.log1p(out)
    return out, grad


class _SpladeMaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, mask, weight, bias, double_log: bool):  # noqa: D401 - autograd API
        batch, length, _ = hidden.shape
        vocab = weight.shape[0]
        chunk = max(256, _CHUNK_ELEMENTS // max(batch * length, 1))
        invalid = ~mask.bool().unsqueeze(-1)
        raw = hidden.new_empty(batch, vocab)
        arg = torch.empty(batch, vocab, dtype=torch.long, device=hidden.device)
        for start in range(0, vocab, chunk):
            stop = min(start + chunk, vocab)
            logits = torch.matmul(hidden, weight[start:stop].t())
            if bias is not None:
                logits += bias[start:stop]
            logits.masked_fill_(invalid, float("-inf"))
            torch.max(logits, dim=1, out=(raw[:, start:stop], arg[:, start:stop]))
        out, dact = _activation(raw, double_log)
        ctx.save_for_backward(hidden, weight, dact, arg)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, dact, arg = ctx.saved_tensors
        g = grad_out * dact  # zero wherever the max logit is <= 0 (relu) or padded
        b_idx, v_idx = torch.nonzero(g, as_tuple=True)
        vals = g[b_idx, v_idx].unsqueeze(-1)
        pos = arg[b_idx, v_idx]
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = torch.zeros_like(hidden)
            grad_hidden.index_put_((b_idx, pos), weight[v_idx] * vals, accumulate=True)
        if ctx.needs_input_grad[2]:
            grad_weight = torch.zeros_like(weight)
            grad_weight.index_add_(0, v_idx, hidden[b_idx, pos] * vals)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_bias = torch.zeros(weight.shape[0], dtype=g.dtype, device=g.device)
            grad_bias.index_add_(0, v_idx, vals.squeeze(-1))
        return grad_hidden, None, grad_weight, grad_bias, None


def splade_max_pool(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation_function: str = "relu",
) -> torch.Tensor:
    """``max_i f(relu(hidden_i W^T + b))`` over valid positions, ``[B, V]``, without ``[B, L, V]``.

    Args:
        hidden: ``[B, L, H]`` output of the MLM head transform (input of the decoder).
        attention_mask: ``[B, L]`` 1 for real tokens.
        weight: ``[V, H]`` decoder weight; bias: ``[V]`` decoder bias or None.
        activation_function: ``"relu"`` (log1p(relu), SPLADE) or ``"log1p_relu"`` (log1p twice),
            as ``SpladePooling`` names them.
    """
    if activation_function not in ("relu", "log1p_relu"):
        raise ValueError(f"activation_function must be 'relu' or 'log1p_relu', got {activation_function!r}")
    return _SpladeMaxPool.apply(hidden, attention_mask, weight, bias, activation_function == "log1p_relu")


def find_splade_pairs(model) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    """``(Transformer(fill-mask), SpladePooling(max))`` pairs that follow each other in ``model``
    (top level or inside a ``Router`` route)."""
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    sequences: list[list[torch.nn.Module]] = [list(model.children())]
    for module in model.modules():
        sub = getattr(module, "sub_modules", None)
        if isinstance(sub, torch.nn.ModuleDict):
            sequences += [list(route.children()) if isinstance(route, torch.nn.Sequential) else list(route)
                          for route in sub.values()]
    pairs = []
    for seq in sequences:
        for first, second in zip(seq, seq[1:]):
            if (isinstance(second, SpladePooling) and second.pooling_strategy == "max"
                    and second.activation_function in ("relu", "log1p_relu")
                    and getattr(first, "transformer_task", None) == "fill-mask"):
                pairs.append((first, second))
    return pairs


def _decoder_slot(auto_model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    decoder = auto_model.get_output_embeddings()
    for name, module in auto_model.named_modules():
        if module is decoder and name:
            parent_name, _, attr = name.rpartition(".")
            return auto_model.get_submodule(parent_name) if parent_name else auto_model, attr
    raise ValueError(f"{type(auto_model).__name__}: MLM decoder not found among its modules")


@contextlib.contextmanager
def fused_splade(model) -> Iterator[int]:
    """Patch every ``Transformer(fill-mask) + SpladePooling(max)`` pair of ``model`` to the fused path.

    Inside the context the transformer returns the decoder *input* (the MLM decoder is swapped for
    ``Identity`` during its forward) and the pooling applies :func:`splade_max_pool` with the real
    decoder weight and bias. Yields the number of patched pairs; restores everything on exit.
    """
    restore = []
    for transformer, pooling in find_splade_pairs(model):
        auto_model = transformer.auto_model
        parent, attr = _decoder_slot(auto_model)
        decoder = getattr(parent, attr)
        t_forward, p_forward = transformer.forward, pooling.forward

        def t_patched(features, *args, _orig=t_forward, _parent=parent, _attr=attr, _decoder=decoder, **kwargs):
            setattr(_parent, _attr, torch.nn.Identity())
            try:
                out = _orig(features, *args, **kwargs)
            finally:
                setattr(_parent, _attr, _decoder)
            out["splade_hidden"] = True
            return out

        def p_patched(features, *args, _orig=p_forward, _decoder=decoder, _pool=pooling, **kwargs):
            if not features.pop("splade_hidden", False):
                return _orig(features, *args, **kwargs)
            if "cu_seq_lens_q" in features:  # flattened FA2 layout: not produced on CPU
                raise NotImplementedError("fused SPLADE pooling does not handle unpadded (FA2) batches")
            pooled = splade_max_pool(features["token_embeddings"], features["attention_mask"],
                                     _decoder.weight, _decoder.bias, _pool.activation_function)
            features.pop("token_embeddings", None)  # the decoder input, not the logits: drop it
            features["sentence_embedding"] = pooled
            return features

        transformer.forward, pooling.forward = t_patched, p_patched
        restore.append((transformer, pooling))
    if not restore:
        logger.info("fused_splade: no Transformer(fill-mask) + SpladePooling(max) pair found")
    try:
        yield len(restore)
    finally:
        for transformer, pooling in restore:
            del transformer.forward, pooling.forward
