"""Batch document encoder: what the exported OpenSearch model computes, fast, as a plain callable.

For each text the exported ``SPARSE_ENCODING`` model (contract section 2.1, PYML
``NeuralSparseModel.forward``) computes SPLADE (Formal et al. 2021, "SPLADE v2") document weights

    w_j = log(1 + relu(max_i z_ij)),   z = MLMHead(Transformer(tokens)),   i over non-padding positions,

sets special-token ids to 0 and hands the non-zero entries to ML Commons. :class:`SparseDocumentEncoder`
returns exactly those entries (positive, finite, >= ``Float.MIN_NORMAL``) as ``(ids, weights)``.

On SPLADE-tiny (2 x 128, 30,522 vocabulary) the MLM decoder, not the body, is most of the cost; in
sentence-transformers so are the elementwise passes over the materialised ``[batch, length, vocab]`` logits.

:meth:`SparseDocumentEncoder.encode` runs **packed batching** by default wherever the model's layout is known
(``batching="auto"``; :mod:`.packed_runner`): tokenized once, documents concatenated into token-budgeted
batches without padding, weights cast once, vectors sparsified on the device, several batches in flight
(``benchmarks/results/gpu_encode.md``). The padded path below (``batching="padded"``, and always
:meth:`~SparseDocumentEncoder.encode_dense`) is the reference; it

* runs the body once per length-sorted micro-batch (little padding) under ``torch.inference_mode``;
* applies the head's transform (dense + gelu + LayerNorm for BERT) to real tokens only (packed);
* computes the decoder in vocabulary chunks with ``addmm`` on small row blocks (a few docs of similar
  length; padding rows repeat a real row of the same doc, which cannot change a max) and keeps only the
  running max, so logits never leave the cache and ``log1p``/``relu`` run on ``[batch, vocab]`` only
  (monotone functions commute with max);
* computes in what :func:`.precision.resolve_precision` picks for ``precision="auto"``: on CUDA fp16 with packed
  batching (a batch that overflows fp16 redone in bf16) and bf16 autocast on the padded path; fp32 on CPU,
  where bf16 matmul without avx512_bf16/AMX is emulated and slower (``precision="bf16"`` still works there, with
  a warning). A bf16 body runs the MLM head in fp16 on CUDA (:func:`.packed_layouts.default_head_dtype`).
  Several GPUs: :class:`~opensearch_lsr.encoding.parallel.DevicePool`, a process each.

It is a plain callable over a batch of texts, so an engine such as Ray Data can map it
(``ds.map_batches(SparseDocumentEncoder, fn_constructor_kwargs={"model": dir}, batch_format="numpy")``:
a dict batch with a ``text`` column gets ``ids`` and ``weights`` columns added).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple, get_args

import numpy as np
import torch

from ..contract import FLOAT_MIN_NORMAL, MAX_LENGTH, decode_keys, special_token_ids
from .precision import Precision, cpu_has_native_bf16, overflow_dtype, resolve_precision
from .sparse_vector import SparseVector
from .word_cache import DEFAULT_MAX_WORDS

__all__ = ["Precision", "Batching", "SparseVector", "EncoderStats", "SparseDocumentEncoder", "MilcoDocumentEncoder",
           "count_tokens", "cpu_has_native_bf16"]

logger = logging.getLogger(__name__)

#: ``packed``: token-budgeted packed batches, weights cast once, sparsified on the device
#: (:mod:`.packed_runner`); ``padded``: length-sorted padded batches under autocast, sparsified on the
#: host (the reference); ``auto``: packed where the model's layout is known, padded otherwise.
Batching = Literal["auto", "packed", "padded"]


@dataclass
class EncoderStats:
    """Running counters: texts and real tokens encoded, weights dropped as non-finite."""

    texts: int = 0
    tokens: int = 0
    truncated: int = 0
    nonfinite_dropped: int = 0
    seconds: float = 0.0
    by_stage: dict[str, float] = field(default_factory=dict)


def count_tokens(tokenizer, texts: Sequence[str]) -> list[int]:
    """Untruncated token counts with special tokens (to apply the 512-token policy)."""
    enc = tokenizer(list(texts), add_special_tokens=True, truncation=False,
                    return_attention_mask=False, return_token_type_ids=False, verbose=False)
    return [len(x) for x in enc["input_ids"]]


class _Head(NamedTuple):
    body: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    transform: Callable[[torch.Tensor], torch.Tensor]
    weight: torch.Tensor
    bias: torch.Tensor | None


def _split_mlm(model) -> _Head | None:
    """Body / head-transform / decoder of the masked-LM families we know; ``None`` otherwise."""
    import torch.nn.functional as F

    kind = type(model).__name__
    if kind == "BertForMaskedLM":
        pred = model.cls.predictions
        dec = pred.decoder
        bias = dec.bias if dec.bias is not None else getattr(pred, "bias", None)
        return _Head(lambda ids, m: model.bert(input_ids=ids, attention_mask=m).last_hidden_state,
                     pred.transform, dec.weight, bias)
    if kind == "DistilBertForMaskedLM":
        act = model.activation
        return _Head(lambda ids, m: model.distilbert(input_ids=ids, attention_mask=m).last_hidden_state,
                     lambda h: model.vocab_layer_norm(act(model.vocab_transform(h))),
                     model.vocab_projector.weight, model.vocab_projector.bias)
    if kind in ("RobertaForMaskedLM", "XLMRobertaForMaskedLM"):
        head = model.lm_head
        body = model.roberta
        return _Head(lambda ids, m: body(input_ids=ids, attention_mask=m).last_hidden_state,
                     lambda h: head.layer_norm(F.gelu(head.dense(h))),
                     head.decoder.weight, head.decoder.bias if head.decoder.bias is not None else head.bias)
    if kind == "ModernBertForMaskedLM":  # transformers modeling_modernbert: logits = decoder(head(model(...)[0]))
        return _Head(lambda ids, m: model.model(input_ids=ids, attention_mask=m).last_hidden_state,
                     model.head, model.decoder.weight, model.decoder.bias)
    return None


def _pooling_config(model_dir: Path) -> dict[str, Any]:
    """The ``SpladePooling`` settings saved in a SparseEncoder dir (defaults: max, relu)."""
    modules = model_dir / "modules.json"
    if modules.exists():
        for entry in json.loads(modules.read_text()):
            if entry.get("type", "").endswith("SpladePooling"):
                cfg = model_dir / entry["path"] / "config.json"
                if cfg.exists():
                    return json.loads(cfg.read_text())
    return {"pooling_strategy": "max", "activation_function": "relu"}


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class SparseDocumentEncoder:
    """Encode documents as the exported OpenSearch ``SPARSE_ENCODING`` model does.

    Args:
        model: a ``SparseEncoder`` directory (HF masked LM at its root), a plain masked-LM dir, a hub
            id, or the ``splade-tiny`` alias.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` ... (default: cuda when available).
        precision: ``"auto"`` (on CUDA fp16 for packed batching, bf16 for padded; fp32 on CPU:
            :func:`.precision.resolve_precision`), ``"fp32"``, ``"bf16"`` or ``"fp16"`` (the pooled weights are
            returned in float32).
        batch_size: texts per forward pass (after sorting by length).
        max_length: token cap, special tokens included (OpenSearch/DJL: 512).
        vocab_chunk: vocabulary rows per decoder matmul (cache-sized; larger on GPU).
        row_block: token rows per decoder matmul (docs of similar length are grouped up to this).
        zero_special_tokens: zero the special-token dims, as the exported model does.
        num_threads: ``torch.set_num_threads`` for CPU runs (``None``: leave as is).
        batching: how :meth:`encode` runs (:data:`Batching`); ``encode_dense`` is always the padded reference.
        max_batch_tokens: real tokens per packed forward pass (default: 64k on a GPU, 4k on CPU).
        compile: packed batching: ``torch.compile`` the whole body (``"body"``; ``"graphs"``: captured and replayed
            as CUDA graphs, :mod:`.graph_replay`, batches padded by :mod:`.graph_buckets`), each block after
            attention (``"block"``) or each residual + LayerNorm step (``True`` / ``"norm"``); ``None``: graphs on
            CUDA in bf16 / fp16 (:func:`.packed.default_compile_scope`).
    """

    def __new__(cls, model: str | os.PathLike | None = None, *args: Any, **kwargs: Any):
        # a MILCO directory (opensearch_lsr.multilingual.lexecho) holds no masked LM at its root: loading it
        # as one would attach a random MLM head, so it gets its own encoder (below); subclasses refuse it
        if model is not None and _is_milco(model):
            if cls is not SparseDocumentEncoder:
                raise ValueError(f"{model}: a MILCO model is encoded by the torch SparseDocumentEncoder only")
            cls = MilcoDocumentEncoder
        return super().__new__(cls)

    def __init__(
        self, model: str | os.PathLike, *, device: str | None = None, precision: Precision = "auto",
        batch_size: int = 32, max_length: int = MAX_LENGTH, vocab_chunk: int | None = None,
        row_block: int | None = None, zero_special_tokens: bool = True, num_threads: int | None = None,
        batching: Batching = "auto", max_batch_tokens: int | None = None, compile: bool | str | None = None,
    ) -> None:
        from transformers import AutoModelForMaskedLM

        from ..inference_free import inference_free_parts, is_inference_free
        from ..transfer.surgery import load_target_tokenizer, resolve_model_path

        if precision not in get_args(Precision):
            raise ValueError(f"precision {precision!r} is not one of {', '.join(get_args(Precision))}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if not 2 < max_length <= MAX_LENGTH:
            raise ValueError(f"max_length must be in (2, {MAX_LENGTH}]: OpenSearch truncates at {MAX_LENGTH} tokens")
        self.device = torch.device(device or _default_device())
        if num_threads and self.device.type == "cpu":
            torch.set_num_threads(int(num_threads))
        path = resolve_model_path(str(model))
        if is_inference_free(path):  # a doc-only Router: the document route is the model that is exported
            path = str(inference_free_parts(path)[0])
        self.model_path = path
        self.tokenizer = load_target_tokenizer(path, what="model tokenizer")
        try:
            self.model = AutoModelForMaskedLM.from_pretrained(path, attn_implementation="eager").eval().to(self.device)
        except OSError as err:  # missing / unreadable weights: one sentence for the user, not a traceback
            raise ValueError(f"model {str(model)!r} has no loadable masked-LM weights: {err}") from err
        pooling = _pooling_config(Path(path)) if os.path.isdir(path) else {}
        if pooling.get("pooling_strategy", "max") != "max":
            raise ValueError(f"{model}: SpladePooling pooling_strategy {pooling['pooling_strategy']!r} "
                             "is not what the OpenSearch export computes (max)")
        self.activation = pooling.get("activation_function", "relu")
        if self.activation not in ("relu", "log1p_relu"):
            raise ValueError(f"{model}: SpladePooling activation {self.activation!r} is not relu or log1p_relu")
        self.precision = resolve_precision(precision, self.device, packed=batching != "padded")
        #: what the padded path computes in (``encode_dense`` always; ``encode`` without packed batching): for "auto"
        #: bf16's range where packed batching would run fp16, since nothing re-encodes an fp16 overflow there
        self.padded_precision = resolve_precision("auto", self.device, packed=False) if precision == "auto" \
            else self.precision
        self.batch_size = int(batch_size)
        self.max_length = int(min(max_length, self.model.config.max_position_embeddings))
        on_gpu = self.device.type == "cuda"
        self.vocab_chunk = int(vocab_chunk or (16384 if on_gpu else 2048))
        self.row_block = int(row_block or (16384 if on_gpu else 256))
        self.head = _split_mlm(self.model)
        if self.head is None:
            logger.warning("%s: unknown masked-LM layout; falling back to full logits (slower)",
                           type(self.model).__name__)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.special_ids = [i for i in special_token_ids(self.tokenizer) if 0 <= i < self.vocab_size]
        self.zero_special_tokens = zero_special_tokens
        self.stats = EncoderStats()
        self.runner = self._packed_runner(batching, max_batch_tokens, compile)

    # ------------------------------------------------------------------ set-up helpers
    def _packed_runner(self, batching: Batching, max_batch_tokens: int | None, compile: bool | str | None = None):
        """The packed runner for ``batching`` (``None``: the padded reference path encodes, in
        :attr:`padded_precision`)."""
        from .packed import default_vocab_chunk
        from .packed_layouts import default_head_dtype, packed_model
        from .packed_runner import PackedRunner
        from .token_batches import default_max_batch_tokens

        if batching not in get_args(Batching):
            raise ValueError(f"batching {batching!r} is not one of {', '.join(get_args(Batching))}")
        self.batching = batching
        if batching == "padded":
            return None
        budget = int(max_batch_tokens or default_max_batch_tokens(self.device.type))
        if budget < self.max_length:
            raise ValueError(f"max_batch_tokens {budget} is below max_length {self.max_length}")
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.precision]
        chunk = default_vocab_chunk(budget, self.vocab_size, self.device.type)
        on_gpu = self.device.type == "cuda"
        packed = packed_model(self.model, dtype, vocab_chunk=chunk, segment_max="reduce" if on_gpu else "rows",
                              row_block=None if on_gpu else self.row_block, compile=compile,
                              head_dtype=default_head_dtype(dtype, self.device))
        if packed is None:
            if batching == "packed":
                logger.warning("%s: no packed layout for this model; encoding padded batches",
                               type(self.model).__name__)
            self.batching = "padded"
            self.precision = self.padded_precision
            return None
        self.batching = "packed"
        packed.max_doc_tokens = min(packed.max_doc_tokens, self.max_length)  # graph batches' attention length
        safe = overflow_dtype(self.device)
        fallback = None if torch.float16 not in (dtype, packed.head_dtype) else (lambda: packed_model(
            self.model, safe, vocab_chunk=chunk, segment_max=packed.segment_max, row_block=packed.row_block,
            compile=False, head_dtype=safe))
        return PackedRunner(packed, activation=self.activation, special_ids=self.special_ids if
                            self.zero_special_tokens else [], max_batch_tokens=budget, fallback=fallback)

    @property
    def once_tokenizer(self):
        """Tokenize-once (:class:`~.token_ids.OnceTokenizer`) at this encoder's ``max_length``."""
        if getattr(self, "_once", None) is None:
            from .token_ids import OnceTokenizer

            self._once = OnceTokenizer(self.tokenizer, self.max_length,
                                       getattr(self.tokenizer, "truncation_side", "right"), self.tokenizer_word_cache)
        return self._once

    def tokenize_async(self, texts: Sequence[str]) -> Future:
        """A future of :attr:`once_tokenizer` ``(texts)`` (:class:`.tokenizer_process.BackgroundTokenizer`)."""
        if getattr(self, "_background", None) is None:
            from .tokenizer_process import BackgroundTokenizer

            self._background = BackgroundTokenizer(self.once_tokenizer, process=self.device.type == "cuda",
                                                   processes=self.tokenizer_processes, threads=self.tokenizer_threads)
        return self._background.submit(texts)

    def close(self) -> None:
        """Stop the background tokenizer, if one was started (encoding again starts a new one)."""
        if getattr(self, "_background", None) is not None:
            self._background.close()
            self._background = None

    def _autocast(self):
        """The padded path's autocast region (:attr:`padded_precision`)."""
        if self.padded_precision == "fp32":
            return torch.autocast(self.device.type, enabled=False)
        dtype = torch.bfloat16 if self.padded_precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    @property
    def keys(self) -> list[str]:
        """WORD keys per id (single-id decode), computed once."""
        if not hasattr(self, "_keys"):
            self._keys = decode_keys(self.tokenizer)
        return self._keys

    # ------------------------------------------------------------------ tokenization
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with special tokens, truncated at ``max_length`` (DJL: LONGEST_FIRST, right)."""
        enc = self.tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=self.max_length,
                             return_attention_mask=False, return_token_type_ids=False)
        return enc["input_ids"]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Untruncated token counts with special tokens (to apply the 512-token policy)."""
        return count_tokens(self.tokenizer, texts)

    # ------------------------------------------------------------------ core
    @torch.inference_mode()
    def encode_dense(self, texts: Sequence[str]) -> torch.Tensor:
        """``[n, V]`` float32 weights on CPU, in input order (special dims zeroed if configured)."""
        return self._in_batches(texts, self._encode_sorted)

    @torch.inference_mode()
    def encode_pooled_logits(self, texts: Sequence[str]) -> torch.Tensor:
        """``[n, V]`` max-pooled MLM logits *before* the activation, float32 on CPU, input order.

        The hook for output-bias studies: adding ``c`` to the bias adds ``c`` to every pooled logit
        (``max_p(x_p + c) = max_p(x_p) + c``), so ``activate(pooled + c)`` gives the shifted model's
        weights from one encode (Activation Potential Calibration sweeps, ``benchmarks/vt_table.py``).
        """
        return self._in_batches(texts, self._pooled_sorted)

    def activate(self, pooled: torch.Tensor) -> torch.Tensor:
        """SPLADE weights of max-pooled logits, in place: ``log1p(relu(.))`` (``log1p`` twice for
        ``log1p_relu``), special dims zeroed as the export does."""
        act = pooled.relu_().log1p_()
        if self.activation == "log1p_relu":
            act = act.log1p_()
        if self.zero_special_tokens and self.special_ids:
            act[:, self.special_ids] = 0.0
        return act

    def _in_batches(self, texts: Sequence[str], encode_sorted: Callable[[list[list[int]]], torch.Tensor]) -> torch.Tensor:
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, not a single string")
        ids = self.tokenize(texts)
        out = torch.zeros(len(ids), self.vocab_size, dtype=torch.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            out[idx] = encode_sorted([ids[i] for i in idx]).float().cpu()
        self.stats.texts += len(ids)
        self.stats.tokens += sum(map(len, ids))
        return out

    def _pad_batch(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Right-padded ``input_ids`` and ``attention_mask`` for token-id lists, plus their lengths."""
        lens = [len(x) for x in batch]
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(batch), max(lens)), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), max(lens)), dtype=torch.long)
        for row, seq in enumerate(batch):
            input_ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, :len(seq)] = 1
        return input_ids, mask, lens

    def _encode_sorted(self, batch: list[list[int]]) -> torch.Tensor:
        """Weights ``[b, V]`` for one micro-batch of token-id lists (roughly equal lengths)."""
        return self.activate(self._pooled_sorted(batch))

    def _pooled_sorted(self, batch: list[list[int]]) -> torch.Tensor:
        """Max-pooled logits ``[b, V]`` (float32) for one micro-batch of token-id lists."""
        input_ids, mask, lens = self._pad_batch(batch)
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        with self._autocast():
            if self.head is None:
                logits = self.model(input_ids=input_ids, attention_mask=mask).logits
                logits = logits.masked_fill(~mask.bool().unsqueeze(-1), float("-inf"))
                pooled = logits.amax(1).float()
            else:
                hidden = self.head.body(input_ids, mask)
                packed = self.head.transform(hidden[mask.bool()])  # real tokens only: [sum(lens), H]
                pooled = self._pooled_logit_max(packed, lens)
        return pooled

    def _pooled_logit_max(self, packed: torch.Tensor, lens: list[int]) -> torch.Tensor:
        """``max_i (packed_i W^T + b)`` per document, in vocab chunks, never ``[tokens, V]`` at once.

        Documents (sorted by length) are grouped into row blocks of about ``row_block`` rows; a group
        is laid out ``[g, Lmax]`` with each padding row pointing at the document's first token, so a
        plain ``amax`` over the length axis is exact (a repeated row cannot change a max).
        """
        weight, bias = self.head.weight, self.head.bias
        dtype = packed.dtype
        if torch.is_autocast_enabled(self.device.type):
            dtype = torch.get_autocast_dtype(self.device.type)
        packed = packed.to(dtype)
        weight = weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        groups: list[tuple[int, int, int, torch.Tensor]] = []  # (first doc, n docs, Lmax, rows)
        i = 0
        while i < len(lens):
            g_max = lens[i]
            j = i + 1
            while j < len(lens) and (j - i + 1) * max(g_max, lens[j]) <= self.row_block:
                g_max = max(g_max, lens[j])
                j += 1
            if j == i + 1:
                rows = packed[starts[i]:starts[i] + lens[i]]
            else:
                index = np.empty((j - i, g_max), dtype=np.int64)
                for k, d in enumerate(range(i, j)):
                    index[k, :] = starts[d]
                    index[k, :lens[d]] = np.arange(starts[d], starts[d] + lens[d])
                rows = packed.index_select(0, torch.from_numpy(index.reshape(-1)).to(packed.device))
            groups.append((i, j - i, g_max, rows))
            i = j
        n, vocab = len(lens), weight.shape[0]
        chunks = []
        for s in range(0, vocab, self.vocab_chunk):
            w_t = weight[s:s + self.vocab_chunk].t()
            b = bias[s:s + self.vocab_chunk] if bias is not None else None
            out = torch.empty((n, w_t.shape[1]), dtype=dtype, device=packed.device)
            for first, count, length, rows in groups:
                logits = torch.addmm(b, rows, w_t) if b is not None else rows @ w_t
                torch.amax(logits.view(count, length, -1), dim=1, out=out[first:first + count])
            chunks.append(out)
        return torch.cat(chunks, dim=1).float()

    def to_sparse(self, dense: torch.Tensor) -> list[SparseVector]:
        """Rows of ``[n, V]`` weights as positive, finite, normal-float ``(ids, weights)`` pairs."""
        arr = dense.numpy() if dense.device.type == "cpu" else dense.cpu().numpy()
        result = []
        for row in arr:
            ids = np.flatnonzero(row)
            w = row[ids]
            good = np.isfinite(w) & (w >= FLOAT_MIN_NORMAL)
            if not good.all():
                self.stats.nonfinite_dropped += int((~np.isfinite(w)).sum())
                ids, w = ids[good], w[good]
            result.append(SparseVector(ids.astype(np.int64), w.astype(np.float32, copy=False)))
        return result

    def encode(self, texts: Sequence[str]) -> list[SparseVector]:
        """Encode texts (any number; sorted by length internally) into sparse vectors, input order."""
        import time

        t0 = time.perf_counter()
        if self.runner is None:
            result = self.to_sparse(self.encode_dense(texts))
        else:
            if isinstance(texts, str):
                raise TypeError("expected a list of texts, not a single string")
            result = self._encode_packed(texts) if len(texts) else []
        self.stats.seconds += time.perf_counter() - t0
        return result

    def warm_up(self, texts: int = 512, sample: Sequence[str] = (), window_docs: int | None = None) -> float:
        """Encode ``texts`` synthetic passages of spread lengths, then ``sample`` (passages of the corpus to come),
        on CUDA only, and forget the counters. The first batches on a GPU pay one-off costs (CUDA context, cuBLAS
        handles, attention kernels, the allocator's first blocks, a CUDA graph per batch shape, captured at once
        here: the corpus's own passages give its shapes, cut in windows of ``window_docs`` as the encode to come
        cuts them [default: :attr:`window_docs`]); a job calls this before its clock starts, as a benchmark warms
        up before it times. Returns the seconds spent (0 on CPU).
        """
        import time

        from .packed_runner import capturing_every_shape
        if str(self.device).split(":")[0] != "cuda" or texts <= 0:
            return 0.0
        t0 = time.perf_counter()
        saved = dataclasses.replace(self.stats, by_stage=dict(self.stats.by_stage))
        window, self.window_docs = self.window_docs, int(window_docs or self.window_docs)
        try:
            with capturing_every_shape(self.runner):
                self.encode(self.warm_up_texts(texts, sample))
        finally:
            self.window_docs = window
        if self.runner is not None:
            self.runner.reset_stats()
        self.stats = saved
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def warm_up_texts(self, texts: int = 512, sample: Sequence[str] = ()) -> list[str]:
        """What :meth:`warm_up` encodes: ``texts`` synthetic passages of spread lengths, then ``sample``."""
        lengths = [8 + (i * 37) % max(9, self.max_length - 8) for i in range(texts)]
        return [" ".join(["warm"] * n) for n in lengths] + list(sample)

    #: on packed batching, the most texts :meth:`encode` cuts into batches at once; the tokenizer gets chunks of
    #: an eighth of it, up to two windows ahead of the device (``PackedRunner.run_texts``)
    window_docs: int = 4096
    #: on CUDA, the tokenizer's processes and its Rust threads in all [default: ``.tokenizer_process``'s]
    tokenizer_processes: int | None = None
    tokenizer_threads: int | None = None
    #: space-separated chunks whose ids the tokenizer remembers (``.word_cache``; per tokenizer process), 0 for none
    tokenizer_word_cache: int = DEFAULT_MAX_WORDS

    def _encode_packed(self, texts: Sequence[str]) -> list[SparseVector]:
        dropped = self.runner.stats.nonfinite_dropped
        result, tokens = self.runner.run_texts(list(texts), self.tokenize_async, self.window_docs)
        self.stats.nonfinite_dropped += self.runner.stats.nonfinite_dropped - dropped
        self.stats.texts += len(result)
        self.stats.tokens += tokens
        return result

    def encode_tokenized(self, tokens) -> list[SparseVector]:
        """Vectors of texts already tokenized by :attr:`once_tokenizer` (packed batching), input order."""
        if self.runner is None:
            raise ValueError("encode_tokenized needs packed batching")
        dropped = self.runner.stats.nonfinite_dropped
        result = self.runner.run(tokens)
        self.stats.nonfinite_dropped += self.runner.stats.nonfinite_dropped - dropped
        self.stats.texts += len(tokens.lengths)
        self.stats.tokens += int(tokens.lengths.sum())
        return result

    def __call__(self, batch):
        """Callable over a batch: a list of texts -> list of :class:`SparseVector`; a dict batch
        (Ray Data ``batch_format="numpy"``/pandas-like) with a ``text`` column -> the same dict with
        ``ids`` and ``weights`` object columns added."""
        if isinstance(batch, dict):
            vectors = self.encode([str(t) for t in batch["text"]])
            out = dict(batch)
            out["ids"] = np.array([v.ids for v in vectors] + [None], dtype=object)[:-1]
            out["weights"] = np.array([v.weights for v in vectors] + [None], dtype=object)[:-1]
            return out
        return self.encode(batch)

    def __repr__(self) -> str:
        return (f"SparseDocumentEncoder({self.model_path!r}, device={self.device}, precision={self.precision}, "
                f"batch_size={self.batch_size}, max_length={self.max_length}, vocab={self.vocab_size})")


def _is_milco(model: str | os.PathLike) -> bool:
    from ..multilingual.milco import is_milco_dir

    return is_milco_dir(str(model))


class MilcoDocumentEncoder(SparseDocumentEncoder):
    """A MILCO model (Nguyen et al. 2025; :mod:`opensearch_lsr.multilingual.lexecho`) encoded like its export:
    ids ``[0, V_src)`` the echoed source view, ``[V_src, V_src + V_en)`` the English pivot view, whose max-pooled
    logits go through this class's packed, vocabulary-chunked path (body = the multilingual encoder,
    transform = connector + the English MLM transform). ``SparseDocumentEncoder(milco_dir)`` returns one.
    WORD keys cannot name two vocabularies, so :attr:`keys` raises: index with key format ``token_id``.
    """

    def __init__(self, model: str | os.PathLike, *, device: str | None = None, precision: Precision = "auto",
                 batch_size: int = 32, max_length: int = MAX_LENGTH, vocab_chunk: int | None = None,
                 row_block: int | None = None, zero_special_tokens: bool = True, num_threads: int | None = None,
                 batching: Batching = "padded", max_batch_tokens: int | None = None) -> None:
        from ..multilingual.milco import load_milco
        from ..transfer.surgery import resolve_model_path

        if batch_size < 1 or not 2 < max_length <= MAX_LENGTH:
            raise ValueError(f"batch_size must be >= 1 and max_length in (2, {MAX_LENGTH}]")
        self.device = torch.device(device or _default_device())
        if num_threads and self.device.type == "cpu":
            torch.set_num_threads(int(num_threads))
        self.model_path = resolve_model_path(str(model))
        self.model = load_milco(self.model_path, device=str(self.device)).eval()
        body, self.lexecho = self.model[0].auto_model, self.model[1]
        self.tokenizer = self.model.tokenizer
        self.head = _Head(lambda ids, m: body(input_ids=ids, attention_mask=m).last_hidden_state,
                          self.lexecho.pivot_hidden, self.lexecho.decoder.weight, self.lexecho.decoder.bias)
        self.activation = "relu"
        self.precision = self.padded_precision = resolve_precision(precision, self.device, packed=False)
        self.batch_size = int(batch_size)
        self.max_length = int(min(max_length, self.model.max_seq_length or MAX_LENGTH))
        on_gpu = self.device.type == "cuda"
        self.vocab_chunk = int(vocab_chunk or (16384 if on_gpu else 2048))
        self.row_block = int(row_block or (16384 if on_gpu else 256))
        self.vocab_size = self.lexecho.get_embedding_dimension()
        self.special_ids = [i for i in special_token_ids(self.tokenizer) if 0 <= i < self.vocab_size]
        self.zero_special_tokens = zero_special_tokens
        self.stats = EncoderStats()
        self.batching, self.runner = "padded", None  # its two views are pooled by _encode_sorted

    @property
    def keys(self) -> list[str]:
        raise ValueError(f"{self.model_path}: a MILCO model's vector holds two vocabularies (source view + English "
                         "pivot view) that WORD keys cannot name; use key format token_id (OpenSearch 3.2+)")

    def _encode_sorted(self, batch: list[list[int]]) -> torch.Tensor:
        input_ids, mask, lens = self._pad_batch(batch)
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        with self._autocast():
            hidden = self.lexecho.pivot_hidden(self.head.body(input_ids, mask))
            pooled = self._pooled_logit_max(hidden[mask.bool()], lens)
            source = self.lexecho.source_from_hidden(hidden, mask, input_ids)
        pivot = self.lexecho.pivot_from_logits(pooled.float())
        return torch.cat([source.float(), pivot], dim=1)

    def _pooled_sorted(self, batch: list[list[int]]) -> torch.Tensor:
        raise ValueError("encode_pooled_logits is defined for masked-LM models, not MILCO")
