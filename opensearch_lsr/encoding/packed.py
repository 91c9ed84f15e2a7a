"""The masked LM over packed documents: no padding token is ever computed.

A batch is the concatenation of its documents' tokens (``[T]`` ids, per-document positions and
``cu_seqlens``, the layout of FlashAttention's varlen kernels, Dao 2023). Every linear layer, the
LayerNorms and the MLM head run on the ``T`` real tokens; attention is the only step that needs to know
where documents start: ``torch.nn.attention.varlen.varlen_attn`` on CUDA in bf16 / fp16 (torch >= 2.10),
otherwise scaled-dot-product attention over a padded view rebuilt from the packed tokens (the CPU and
fp32 reference). The vocabulary head runs per vocabulary chunk and takes each document's max over its
own rows (``torch.segment_reduce``), so ``[T, V]`` logits never exist at once and no padded row is
multiplied.

Weights are cast to the compute dtype once, when the packed model is built; the residual stream and every
LayerNorm stay in float32 (as autocast would run them). The layouts are those of transformers' BERT,
RoBERTa / XLM-R (positions start at ``padding_idx + 1``) and DistilBERT masked LMs, and ModernBERT's own
block (:mod:`.packed_modernbert`); :func:`.packed_layouts.packed_model` builds one from a Hugging Face model
(``None`` for any other layout: the encoder then runs its padded reference path).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .graph_buckets import graph_max_len, graph_shape, padding_lengths
from .graph_replay import GraphReplay
from .staging import stage

logger = logging.getLogger(__name__)

__all__ = ["Segments", "PackedMLM", "CompiledStep", "default_compile_scope", "padded_attention", "varlen_available",
           "default_vocab_chunk", "flops_per_token", "cast_weight", "layer_norm_params", "head_transform",
           "PostLNBlock"]


@dataclass
class Segments:
    """Where each document sits in a packed batch (all tensors on the compute device).

    Attributes:
        lengths: tokens per document, int64 ``[n]``.
        cu_seqlens: cumulative lengths ``[n + 1]``, int32 (varlen attention).
        max_len: the longest document.
        positions: each token's position inside its document, int64 ``[T]``.
        pad_slots: each token's row in a ``[n * max_len]`` padded view, int64 ``[T]``.
        fill_rows: (built on first use: the head's ``gather`` and ``rows`` maxima need it, ``reduce`` does not)
            for each slot of that padded view, a row of the same document (its own token, or the document's
            last token past its end), int64 ``[n * max_len]``: a max over them is the document's max.
        host_lengths: the real documents' lengths, on the host.
        real_docs, real_tokens: with a graph bucket's padding (``from_lengths(pad_to=...)``), how many of the
            documents and tokens are real (they come first; :meth:`real` is their view); else ``None``.
        staged: the one device buffer that ``lengths``, ``cu_seqlens``, ``positions``, ``pad_slots`` (and the
            batch's ids, :meth:`packed_batch`) are views of (:func:`.staging.stage`); ``None`` for views of views.
    """

    lengths: torch.Tensor
    cu_seqlens: torch.Tensor
    max_len: int
    positions: torch.Tensor
    pad_slots: torch.Tensor
    host_lengths: np.ndarray
    pin: bool = False
    _fill_rows: torch.Tensor | None = None
    real_docs: int | None = None
    real_tokens: int | None = None
    staged: torch.Tensor | None = None

    @staticmethod
    def fill_index(lengths: np.ndarray) -> np.ndarray:
        """``fill_rows`` of documents of ``lengths`` laid out one after the other, on the host."""
        starts = np.cumsum(lengths) - lengths
        width = int(lengths.max())
        return (starts[:, None] + np.minimum(np.arange(width)[None, :], lengths[:, None] - 1)).reshape(-1)

    @property
    def fill_rows(self) -> torch.Tensor:
        if self._fill_rows is None:
            self._fill_rows = _move(self.fill_index(self.host_lengths), self.lengths.device, self.pin)
        return self._fill_rows

    @classmethod
    def from_lengths(cls, lengths: np.ndarray, device: torch.device, *, pin: bool = False,
                     pad_to: tuple[int, ...] | None = None, max_doc: int | None = None) -> Segments:
        """Build the index tensors on the host (numpy, vectorised) and move them in one copy
        (:func:`.staging.stage`).

        ``pad_to``: a graph bucket's ``(tokens, documents)`` (:func:`.graph_buckets.graph_shape` with ``max_doc``,
        the longest document the model takes): padding documents follow the real ones, and ``max_len`` is the
        longest one rounded up (:func:`.graph_buckets.graph_max_len`); or its ``(tokens, documents, longest)`` key
        (:func:`.graph_buckets.graph_key`, a larger bucket's: :func:`.graph_buckets.larger_bucket`), ``max_len`` then
        its ``longest``.
        """
        return cls._staged(None, lengths, device, pin, pad_to, max_doc)[1]

    @classmethod
    def packed_batch(cls, ids: np.ndarray, lengths: np.ndarray, device: torch.device, *, pin: bool = False,
                     pad_to: tuple[int, ...] | None = None, max_doc: int | None = None) -> tuple[torch.Tensor, Segments]:
        """A batch's packed ``ids`` (zeros appended up to a bucket's token count with ``pad_to``) and its segments,
        moved to ``device`` together in one copy (:meth:`from_lengths` for the arguments)."""
        ids = np.asarray(ids, dtype=np.int64)
        if pad_to is not None:
            ids = np.concatenate([ids, np.zeros(pad_to[0] - len(ids), np.int64)])
        device_ids, seg = cls._staged(ids, lengths, device, pin, pad_to, max_doc)
        assert device_ids is not None
        return device_ids, seg

    @classmethod
    def _staged(cls, ids: np.ndarray | None, lengths: np.ndarray, device: torch.device, pin: bool,
                pad_to: tuple[int, ...] | None, max_doc: int | None) -> tuple[torch.Tensor | None, Segments]:
        real = lengths = np.asarray(lengths, dtype=np.int64)
        if pad_to is not None:
            if len(real) and int(real.max()) > int(max_doc):  # type: ignore[arg-type]
                raise ValueError(f"a document of {int(real.max())} tokens is over max_doc {max_doc}")
            lengths = np.concatenate([real, padding_lengths(int(real.sum()), len(real), pad_to[:2])])
        n, total = len(lengths), int(lengths.sum())
        if ids is not None and len(ids) != total:
            raise ValueError(f"{len(ids)} ids for documents of {total} tokens")
        max_len = int(lengths.max())
        if pad_to is not None:
            rounded = graph_max_len(max_len, int(max_doc))  # type: ignore[arg-type]
            max_len = int(pad_to[2]) if len(pad_to) > 2 else rounded
            if not rounded <= max_len <= int(max_doc):  # type: ignore[arg-type]
                raise ValueError(f"a bucket's longest document {max_len} is under {rounded} or over max_doc {max_doc}")
        starts = np.cumsum(lengths) - lengths
        positions = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
        pad_slots = np.repeat(np.arange(n, dtype=np.int64) * max_len, lengths) + positions
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        arrays = ([] if ids is None else [ids]) + [lengths, positions, pad_slots, cu]
        buffer, views = stage(arrays, device, pin=pin)
        device_ids = views.pop(0) if ids is not None else None
        lengths_t, positions_t, pad_slots_t, cu_t = views
        return device_ids, cls(lengths_t, cu_t, max_len, positions_t, pad_slots_t, real, pin,
                               real_docs=len(real) if pad_to else None,
                               real_tokens=int(real.sum()) if pad_to else None, staged=buffer)

    def real(self) -> Segments:
        """The real documents of a padded batch (views; the padded view's ``max_len`` kept), else ``self``."""
        if self.real_docs is None:
            return self
        n, t = self.real_docs, int(self.real_tokens)  # type: ignore[arg-type]
        return Segments(self.lengths[:n], self.cu_seqlens[:n + 1], self.max_len, self.positions[:t],
                        self.pad_slots[:t], self.host_lengths, self.pin)


def _move(a: np.ndarray, device: torch.device, pin: bool) -> torch.Tensor:
    """A host array on ``device`` (through pinned memory, asynchronously, with ``pin`` on CUDA)."""
    t = torch.from_numpy(a)
    if pin and device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=pin)


def varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether FlashAttention's varlen kernel serves this device and dtype (CUDA, bf16 / fp16)."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401 - torch >= 2.10
    except ImportError:
        return False
    return True


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segments,
                     window: int | None = None) -> torch.Tensor:
    """Attention of packed ``[T, heads, d]`` q/k/v through a padded ``[n, heads, L, d]`` view (SDPA with a
    key mask; ``window``: keys within that many positions only); padded rows are zeros, masked out as keys
    and dropped as queries."""
    n, L = len(seg.lengths), seg.max_len
    heads, d = q.shape[1], q.shape[2]

    def pad(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(n * L, heads, d)
        out.index_copy_(0, seg.pad_slots, x)
        return out.view(n, L, heads, d).transpose(1, 2)

    span = torch.arange(L, device=q.device)
    mask = (span[None, :] < seg.lengths[:, None])[:, None, None, :]
    if window is not None:
        mask = mask & ((span[:, None] - span[None, :]).abs() <= window)[None, None]
    out = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=mask)
    return out.transpose(1, 2).reshape(n * L, heads, d).index_select(0, seg.pad_slots)


class PostLNBlock(NamedTuple):
    """One post-LN transformer block (BERT / RoBERTa / DistilBERT): weights in the compute dtype,
    LayerNorm parameters in float32."""

    qkv_w: torch.Tensor
    qkv_b: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor
    ln1: tuple[torch.Tensor, torch.Tensor, float]
    up_w: torch.Tensor
    up_b: torch.Tensor
    act: Callable[[torch.Tensor], torch.Tensor]
    down_w: torch.Tensor
    down_b: torch.Tensor
    ln2: tuple[torch.Tensor, torch.Tensor, float]


def _add_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-LN residual step: ``LayerNorm(x + y)`` in float32 (``y`` in the compute dtype is promoted),
    returned in float32 (the residual stream) and in the compute dtype (the next matmul's input)."""
    z = F.layer_norm(x + y, x.shape[-1:], weight, bias, eps)
    return z, (z if dtype == torch.float32 else z.to(dtype))


def default_compile_scope(device: torch.device, dtype: torch.dtype) -> str | None:
    """What packed batching compiles when the caller does not say: on CUDA in bf16 / fp16 the whole body, captured
    as a CUDA graph per bucketed batch shape and replayed (``"graphs"``, :mod:`.graph_replay`); nothing elsewhere.

    Measured on an H200 (``benchmarks/results/gpu_encode.md``): compiling each residual + LayerNorm step took
    BERT-base from 14,125 to 16,058 docs/s (runs 8-10) but left the host launching 24 compiled calls per batch
    (busy 70-72 %); the whole body as one compiled call (``"body"``) did 16,758 and 16,430 docs/s against 14,833
    and 15,117 for the per-step compile in the same runs (12, 13), busy 87-89 %, yet still took the host 30-34 ms
    per 64k-token batch (its 57 ``addmm`` calls alone: 9.4 ms of host time). Replaying graphs: busy
    91.1 % against 74.6 % (run 16), SPLADE-tiny 18,066 docs/s against 14,889 for ``"body"`` (runs 14, 15), and the
    ``lsr-os index`` job, whose launching thread shares the interpreter with the reader and writer, 8,200 against
    7,546 docs/s (run 16). fp32 keeps ATen's kernels (the reference-grade path); on CPU the body is matmul-bound
    and compiling gained nothing (300 SPLADE-tiny passages: 3.40-3.63 s compiled, 3.42-3.46 s eager).
    """
    return "graphs" if device.type == "cuda" and dtype != torch.float32 else None


def _block_tail(x: torch.Tensor, ctx: torch.Tensor, out_w: torch.Tensor, out_b: torch.Tensor, ln1: tuple,
                up_w: torch.Tensor, up_b: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor],
                down_w: torch.Tensor, down_b: torch.Tensor, ln2: tuple, dtype: torch.dtype,
                add_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] = _add_norm
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A post-LN block after its attention: output projection, residual + LayerNorm, feed-forward, residual +
    LayerNorm; the residual stream in float32 and in the compute dtype, as :func:`_add_norm` returns it."""
    x, xc = add_norm(x, F.linear(ctx, out_w, out_b), *ln1, dtype)
    up = act(F.linear(xc, up_w, up_b))
    return add_norm(x, F.linear(up, down_w, down_b), *ln2, dtype)


class CompiledStep:
    """``fn`` through ``torch.compile``, and ``fn`` itself from then on, with a warning, if compiling fails (no
    Triton, no C++ compiler). Shapes are dynamic in the token count only (automatic dynamic shapes: the first
    call compiles for its shape, the second for any token count)."""

    def __init__(self, fn: Callable[..., Any], eager: Callable[..., Any] | None = None) -> None:
        self.fn = fn
        self.eager = eager or fn  # what runs instead once compiling has failed
        self._compiled = torch.compile(fn)
        self.compiled = True

    def __call__(self, *args: Any) -> Any:
        if not self.compiled:
            return self.eager(*args)
        try:
            return self._compiled(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - any compiler failure: the eager step computes the same
            logger.warning("torch.compile of %s failed (%s: %s); running it eagerly", self.fn.__name__,
                           type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
            self.compiled = False
            return self.eager(*args)


class PackedMLM:
    """Body and MLM head of a BERT-family masked LM over packed documents.

    Built by :func:`.packed_layouts.packed_model`; :meth:`pooled_max` is the whole forward: max over each document's
    tokens of the MLM logits, ``[n, V]`` float32 (the activation is the encoder's).
    """

    def __init__(self, *, word: torch.Tensor, position: torch.Tensor, token_type: torch.Tensor | None,
                 emb_ln: tuple[torch.Tensor, torch.Tensor, float], position_offset: int, heads: int,
                 layers: list[PostLNBlock], transform: Callable[[torch.Tensor], torch.Tensor],
                 decoder_w: torch.Tensor, decoder_b: torch.Tensor | None, dtype: torch.dtype,
                 vocab_chunk: int, segment_max: str = "reduce", row_block: int | None = None,
                 compile: bool | str = False) -> None:
        if segment_max not in ("reduce", "gather", "rows"):
            raise ValueError(f"segment_max {segment_max!r} is not 'reduce', 'gather' or 'rows'")
        self.segment_max = segment_max
        self.row_block = row_block
        # what torch.compile fuses: each residual + LayerNorm step ("norm", what True means), everything of a
        # block after its attention in one region per layer ("block": half the compiled calls per batch), or the
        # whole body and the head's transform in one region ("body": one compiled call per batch, attention a
        # custom op inside it), or that region captured and replayed as CUDA graphs ("graphs": .graph_replay, batches
        # padded to the shapes of .graph_buckets)
        scope = "norm" if compile is True else (compile or None)
        if scope not in (None, "norm", "block", "body", "graphs"):
            raise ValueError(f"compile {compile!r} is not a bool, 'norm', 'block', 'body' or 'graphs'")
        self.compile_scope = scope
        self._add_norm = CompiledStep(_add_norm) if scope == "norm" else _add_norm
        self._tail = CompiledStep(_block_tail) if scope == "block" else None
        self._body = CompiledStep(self._traced_hidden, eager=lambda ids, seg: self._hidden(ids, seg, self._attend)) \
            if scope in ("body", "graphs") else None
        self.graphs = scope == "graphs"
        #: compile="graphs" on CUDA: the body's CUDA graphs, one per bucket (off CUDA the body runs as it is)
        self.graph_replay = GraphReplay(self._body) if self.graphs and word.device.type == "cuda" else None
        self._graphs_warned = False
        #: the longest document the position table takes (graph batches tell attention this length)
        self.max_doc_tokens = int(position.shape[0]) - int(position_offset)
        self.word, self.position, self.token_type, self.emb_ln = word, position, token_type, emb_ln
        self.position_offset, self.heads, self.layers = position_offset, heads, layers
        self.transform, self.decoder_b = transform, decoder_b
        self.dtype = dtype
        self.head_dtype = decoder_w.dtype  # the transform's and the decoder's (fp16 beside a bf16 body on CUDA)
        # the decoder in vocabulary chunks, transposed once into contiguous ``[H, chunk]`` blocks for ``addmm``
        self.decoder_t = [decoder_w[s:s + vocab_chunk].t().contiguous()
                          for s in range(0, decoder_w.shape[0], vocab_chunk)]
        self.vocab_chunk = vocab_chunk
        self.device = word.device
        self.vocab_size = int(decoder_w.shape[0])
        self.use_varlen = varlen_available(self.device, dtype)
        if self.use_varlen:
            from torch.nn.attention.varlen import varlen_attn

            self._varlen = varlen_attn

    @property
    def compiled(self) -> bool:
        """Whether the steps after attention run through ``torch.compile`` (:class:`CompiledStep`)."""
        return any(isinstance(f, CompiledStep) and f.compiled for f in (self._add_norm, self._tail, self._body))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segments) -> torch.Tensor:
        if self.use_varlen:
            try:
                return self._varlen(q, k, v, seg.cu_seqlens, seg.cu_seqlens, seg.max_len, seg.max_len)
            except (RuntimeError, TypeError, NotImplementedError) as err:  # an older or partial torch build
                logger.warning("varlen attention failed (%s); using padded SDPA from now on", err)
                self.use_varlen = False
        return padded_attention(q, k, v, seg)

    def graph_bucket(self, lengths: np.ndarray) -> tuple[int, ...] | None:
        """The bucket a batch of documents of ``lengths`` is padded to with ``compile="graphs"``: its own
        ``(tokens, documents)``, or on CUDA the key of a larger bucket already captured
        (:meth:`.graph_replay.GraphReplay.bucket_for`); else ``None``."""
        if not self.graphs:
            return None
        if self.graph_replay is not None:
            return self.graph_replay.bucket_for(lengths, self.max_doc_tokens)
        return graph_shape(int(np.sum(lengths)), len(lengths), self.max_doc_tokens)

    def hidden(self, ids: torch.Tensor, seg: Segments) -> torch.Tensor:
        """The head-transformed hidden state of every packed token, ``[T, H]`` in the head's dtype (of the real
        tokens only, for a batch padded to a graph bucket)."""
        if self._body is None:
            return self._hidden(ids, seg, self._attend)
        if not self.graphs:
            return self._body(ids, seg)
        if self.graph_replay is not None:
            return self.graph_replay(ids, seg)[:seg.real_tokens]  # valid until the next batch's replay
        if not self._graphs_warned:
            self._graphs_warned = True
            logger.warning("compile='graphs': the body runs without CUDA graphs on %s; batches are still padded to "
                           "graph shapes", self.device)
        return self._body(ids, seg)[:seg.real_tokens]

    def _traced_hidden(self, ids: torch.Tensor, seg: Segments) -> torch.Tensor:
        """:meth:`hidden` as ``torch.compile`` traces it: the attention chosen once, no fallback inside."""
        if self.use_varlen:
            return self._hidden(ids, seg, lambda q, k, v, s: self._varlen(q, k, v, s.cu_seqlens, s.cu_seqlens,
                                                                          s.max_len, s.max_len))
        return self._hidden(ids, seg, padded_attention)

    def _hidden(self, ids: torch.Tensor, seg: Segments, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        dt = self.dtype
        x = F.embedding(ids, self.word) + F.embedding(seg.positions + self.position_offset, self.position)
        if self.token_type is not None:
            x = x + self.token_type
        x = F.layer_norm(x.float(), x.shape[-1:], *self.emb_ln[:2], self.emb_ln[2])
        xc = x.to(dt)
        total, width = x.shape
        head_dim = width // self.heads
        for layer in self.layers:
            qkv = F.linear(xc, layer.qkv_w, layer.qkv_b).view(total, 3, self.heads, head_dim)
            ctx = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2], seg).reshape(total, width)
            tail = (x, ctx, layer.out_w, layer.out_b, layer.ln1, layer.up_w, layer.up_b, layer.act, layer.down_w,
                    layer.down_b, layer.ln2, dt)
            x, xc = self._tail(*tail) if self._tail is not None else _block_tail(*tail, self._add_norm)
        return self.transform(xc if self.head_dtype == dt else x)  # a head in another dtype reads the fp32 stream

    def pooled_max(self, ids: torch.Tensor, seg: Segments) -> torch.Tensor:
        """``max_i (h_i W^T + b)`` per document over its own tokens, ``[n, V]`` float32, vocabulary chunk by
        chunk (``segment_reduce`` over the packed rows, or ``gather``: the rows laid out ``[n, L]`` with a
        document's last row repeated past its end; no ``[T, V]`` tensor, no padded row multiplied)."""
        return self.head_max(self.hidden(ids, seg), seg.real())

    def head_max(self, h: torch.Tensor, seg: Segments) -> torch.Tensor:
        """The vocabulary head and each document's max over its own rows, from :meth:`hidden`'s output.

        ``segment_max`` says how the max is taken per vocabulary chunk: ``reduce`` (``segment_reduce`` over
        the packed logits), ``gather`` (the packed logits laid out ``[n, L]``, a document's last row repeated
        past its end, then ``amax``) or ``rows`` (the hidden rows laid out that way before the matmul: the
        padded cells are computed, in exchange for a plain ``amax``; the CPU's choice, where
        ``segment_reduce`` is slow). With ``row_block`` (CPU) documents go through in groups of about that
        many rows, so each logits block stays in cache; on a GPU all rows go at once.
        """
        n = len(seg.lengths)
        out = torch.empty((n, self.vocab_size), dtype=torch.float32, device=h.device)
        groups = []
        for d0, d1, r0, r1 in self._row_groups(seg.host_lengths):
            lengths = seg.host_lengths[d0:d1]
            width = int(lengths.max())
            fill_t = None  # the padded view's rows, built only for the maxima that use them
            if self.segment_max != "reduce":
                whole = (d0, d1) == (0, n)
                fill_t = seg.fill_rows if whole else torch.from_numpy(Segments.fill_index(lengths)).to(h.device)
            x = h[r0:r1] if self.segment_max != "rows" else h[r0:r1].index_select(0, fill_t)
            groups.append((d0, d1, width, x, fill_t, seg.lengths if (d0, d1) == (0, n) else
                           torch.from_numpy(lengths).to(h.device)))
        s = 0
        for w_t in self.decoder_t:
            e = s + w_t.shape[1]
            b = self.decoder_b[s:e] if self.decoder_b is not None else None
            for d0, d1, width, x, fill_t, lengths in groups:
                logits = self._logits(b, x, w_t)
                if self.segment_max == "reduce":
                    block = torch.segment_reduce(logits, "max", lengths=lengths, axis=0, unsafe=True)
                elif self.segment_max == "gather":
                    block = logits.index_select(0, fill_t).view(d1 - d0, width, -1).amax(1)
                else:
                    block = logits.view(d1 - d0, width, -1).amax(1)
                out[d0:d1, s:e] = block
            s = e
        return out

    def _logits(self, b: torch.Tensor | None, x: torch.Tensor, w_t: torch.Tensor) -> torch.Tensor:
        """``x @ w_t + b`` in the head's dtype. (A float32 output, ``addmm(..., out_dtype=float32)``,
        doubled the head's time on an H200 and left the bf16-vs-fp32 distance unchanged: the rounding of the
        inputs, the transform's and the body's, dominates it; see :func:`.packed_layouts.default_head_dtype`.)"""
        return torch.addmm(b, x, w_t) if b is not None else x @ w_t

    def _row_groups(self, lengths: np.ndarray) -> list[tuple[int, int, int, int]]:
        """``(first doc, end doc, first row, end row)`` of consecutive documents of about ``row_block`` rows
        (one group without ``row_block``)."""
        rows = np.cumsum(lengths)
        if not self.row_block or int(rows[-1]) <= self.row_block:
            return [(0, len(lengths), 0, int(rows[-1]))]
        groups, d0, r0 = [], 0, 0
        while d0 < len(lengths):
            d1 = max(d0 + 1, int(np.searchsorted(rows, r0 + self.row_block, side="right")))
            r1 = int(rows[d1 - 1])
            groups.append((d0, d1, r0, r1))
            d0, r0 = d1, r1
        return groups


def cast_weight(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.detach().to(dtype).contiguous()


def layer_norm_params(module: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
    weight = module.weight.detach().float()
    bias = module.bias.detach().float() if module.bias is not None else torch.zeros_like(weight)
    return weight, bias, float(module.eps)


def head_transform(dense: Any, act: Callable, norm: Any, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLM head's transform (``dense`` -> activation -> LayerNorm ``norm``), weights cast once to the head's
    ``dtype``; its input (the body's float32 stream) cast to it, its output in it."""
    dense_w, dense_b, ln = cast_weight(dense.weight, dtype), cast_weight(dense.bias, dtype), layer_norm_params(norm)

    def run(x: torch.Tensor) -> torch.Tensor:
        y = act(F.linear(x.to(dtype), dense_w, dense_b))
        return F.layer_norm(y.float(), y.shape[-1:], ln[0], ln[1], ln[2]).to(dtype)
    return run


def default_vocab_chunk(tokens_per_batch: int, vocab: int, device_type: str) -> int:
    """Vocabulary rows per head matmul: about 512 MB of logits on a GPU, 8 MB of cache-sized blocks on CPU."""
    if device_type == "cuda":
        return max(1024, min(vocab, (256 << 20) // max(1, tokens_per_batch)))
    return 2048


def flops_per_token(model: Any) -> float:
    """Matmul FLOPs per token of the masked LM's forward (linear layers + MLM head; attention scores
    excluded): ``2 x`` the weights that touch every token."""
    cfg = model.config
    hidden = getattr(cfg, "hidden_size", None) or cfg.dim
    inter = getattr(cfg, "intermediate_size", None) or cfg.hidden_dim
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layers
    vocab = model.get_output_embeddings().weight.shape[0]
    return 2.0 * (layers * (4 * hidden * hidden + 2 * hidden * inter) + hidden * hidden + hidden * vocab)

