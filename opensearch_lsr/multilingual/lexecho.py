"""MILCO's connector + LexEcho head as a sentence-transformers module (Nguyen et al. 2025, arXiv 2510.00671).

A MILCO ``SparseEncoder`` is ``[Transformer(multilingual encoder), LexEchoHead]``. The head takes the
encoder's token states ``H`` and

1. projects them into the hidden space of an English SPLADE model's MLM head with the **multilingual
   connector** ``Z = LayerNorm(Linear(GELU(Linear(H))))`` (paper section 3, "Multilingual Connector");
2. runs that English MLM head (its ``transform`` and its decoder, copied from the teacher) and
   SPLADE-pools ``log(1 + relu(logits))`` by max over the unmasked positions: the **pivot view**, one
   weight per English vocabulary entry (Formal et al. 2021, SPLADE v2);
3. the **source view** (LexEcho): one extra decoder row, the ``[ECHO]`` output, whose logit at position
   ``t`` weighs the input token ``t`` itself: ``w_src[id_t] = max_t log(1 + relu(echo_t))``, i.e. the
   input tokens echoed into the encoder's own vocabulary. Special tokens are never emitted (both views).

**Key layout** (never colliding in one index): output dimension ``V_src + V_en``, the source view
first (ids ``[0, V_src)`` are the encoder tokenizer's own ids) and the pivot view offset by ``V_src``
(id ``V_src + j`` is English token ``j``). An inference-free query side (ML Commons ``SPARSE_TOKENIZE``
with the encoder's tokenizer) therefore hits the source view directly under TOKEN_ID keys.
``source_view=False`` (the ablation "MILCO without LexEcho's source view") keeps the same layout with
the source block all zero, so keys keep their meaning across the ablation.

**OpenSearch**: ML Commons' WORD format decodes every output id through the ONE ``tokenizer.json`` of
the zip (``SparseEncodingTranslator.convertOutput``: ``tokenizer.decode([idx], true)``); with two
vocabularies the pivot ids (``>= V_src``) have no token there and would be dropped, so WORD keys cannot
carry a MILCO vector. TOKEN_ID keys (``String.valueOf(idx)``, no decode; ``sparse_embedding_format``,
OpenSearch >= 3.2, ml-commons ``SparseEncodingTranslator`` at 3.2.0.0) carry both views; neural-search
asks for TOKEN_ID by itself only for ``sparse_vector`` (SEISMIC) fields (>= 3.3, ``index.sparse``),
so a ``rank_features`` index needs client-side encoding with token-id keys.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import torch
from sentence_transformers.base.modules.module import Module
from torch import nn

__all__ = ["LexEchoHead", "MilcoEncodingModule", "ECHO_BIAS_INIT"]

#: Initial bias of the ``[ECHO]`` row (its weight starts at zero): every input token starts echoed with
#: weight log(1 + 1) ~ 0.69 (a bag of the input tokens), so relu passes gradient at every position.
ECHO_BIAS_INIT = 1.0
PIVOT_TOKENIZER_DIR = "pivot_tokenizer"


class LexEchoHead(Module):
    """Connector + English MLM head + ``[ECHO]`` row; output ``[batch, source_vocab_size + pivot_vocab_size]``.

    Args:
        encoder_hidden_size: hidden size of the multilingual encoder (384 for multilingual-e5-small).
        pivot_hidden_size: hidden size of the English MLM head (128 for SPLADE-tiny).
        source_vocab_size: encoder tokenizer size (ids ``[0, V_src)`` of the output).
        pivot_vocab_size: English vocabulary size (ids ``[V_src, V_src + V_en)``).
        connector_hidden_size: width of the connector MLP (default: ``encoder_hidden_size``).
        source_view: emit the LexEcho source view (``False``: the ablation, source block all zero).
        source_special_ids / pivot_special_ids: ids never emitted in each view.
        layer_norm_eps: epsilon of the connector's and the MLM transform's LayerNorm.
    """

    config_keys: list[str] = [
        "encoder_hidden_size", "pivot_hidden_size", "source_vocab_size", "pivot_vocab_size",
        "connector_hidden_size", "source_view", "source_special_ids", "pivot_special_ids", "layer_norm_eps",
    ]
    config_file_name = "lexecho_config.json"
    #: both views are max pooled ``log(1 + relu)`` (read by the export manifest, like SpladePooling's fields)
    pooling_strategy = "max"
    activation_function = "relu"

    def __init__(self, encoder_hidden_size: int, pivot_hidden_size: int, source_vocab_size: int,
                 pivot_vocab_size: int, connector_hidden_size: int | None = None, source_view: bool = True,
                 source_special_ids: list[int] | None = None, pivot_special_ids: list[int] | None = None,
                 layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        self.encoder_hidden_size = int(encoder_hidden_size)
        self.pivot_hidden_size = int(pivot_hidden_size)
        self.source_vocab_size = int(source_vocab_size)
        self.pivot_vocab_size = int(pivot_vocab_size)
        self.connector_hidden_size = int(connector_hidden_size or encoder_hidden_size)
        self.source_view = bool(source_view)
        self.source_special_ids = sorted({int(i) for i in (source_special_ids or [])})
        self.pivot_special_ids = sorted({int(i) for i in (pivot_special_ids or [])})
        self.layer_norm_eps = float(layer_norm_eps)
        for name, ids, size in (("source", self.source_special_ids, self.source_vocab_size),
                                ("pivot", self.pivot_special_ids, self.pivot_vocab_size)):
            if any(i < 0 or i >= size for i in ids):
                raise ValueError(f"{name}_special_ids must lie in [0, {size}), got {ids}")
        # connector: Z = LayerNorm(Linear(phi(H))), phi = Linear + GELU (paper eq. 2)
        self.connector = nn.Sequential(
            nn.Linear(self.encoder_hidden_size, self.connector_hidden_size), nn.GELU(),
            nn.Linear(self.connector_hidden_size, self.pivot_hidden_size),
            nn.LayerNorm(self.pivot_hidden_size, eps=self.layer_norm_eps),
        )
        # the English MLM head (BERT's cls.predictions: dense + gelu + LayerNorm, then the decoder)
        self.transform = nn.Sequential(
            nn.Linear(self.pivot_hidden_size, self.pivot_hidden_size), nn.GELU(),
            nn.LayerNorm(self.pivot_hidden_size, eps=self.layer_norm_eps),
        )
        self.decoder = nn.Linear(self.pivot_hidden_size, self.pivot_vocab_size)
        self.echo = nn.Linear(self.pivot_hidden_size, 1)  # the [ECHO] output: one more decoder row
        nn.init.zeros_(self.echo.weight)
        nn.init.constant_(self.echo.bias, ECHO_BIAS_INIT)
        self.register_buffer("source_keep", self._keep(self.source_vocab_size, self.source_special_ids), persistent=False)
        self.register_buffer("pivot_keep", self._keep(self.pivot_vocab_size, self.pivot_special_ids), persistent=False)
        self.pivot_tokenizer = None  # the English tokenizer (key names); set by load / milco.build_milco
        #: optional ``f(hidden, mask, weight, bias, "relu") -> [B, V_en]`` computing the pivot view without the
        #: ``[B, L, V_en]`` logits (the trainer sets ``training.fused_splade.splade_max_pool``: same numbers)
        self.pivot_pool = None

    @staticmethod
    def _keep(size: int, special: list[int]) -> torch.Tensor:
        keep = torch.ones(size, dtype=torch.float32)
        if special:
            keep[torch.tensor(special, dtype=torch.long)] = 0.0
        return keep

    # ------------------------------------------------------------------ forward

    def pivot_hidden(self, token_embeddings: torch.Tensor) -> torch.Tensor:
        """Encoder token states -> the English MLM head's transformed states ``[B, L, pivot_hidden_size]``."""
        return self.transform(self.connector(token_embeddings))

    def pooled_logits(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Max over the unmasked positions of the English MLM logits, ``[B, V_en]``. The pivot view is
        ``log(1 + relu(.))`` of it (monotone, so pooling first equals SpladePooling's relu-log1p-max) and
        SAP reads the raw maxima to revive dimensions whose logits went negative."""
        logits = self.decoder(hidden)
        padded = (attention_mask == 0).unsqueeze(-1)
        return logits.masked_fill(padded, torch.finfo(logits.dtype).min).max(dim=1)[0]

    def pivot_from_logits(self, pooled: torch.Tensor) -> torch.Tensor:
        return torch.log1p(torch.relu(pooled)) * self.pivot_keep

    def source_from_hidden(self, hidden: torch.Tensor, attention_mask: torch.Tensor,
                           input_ids: torch.Tensor) -> torch.Tensor:
        """The source view ``[B, V_src]`` from the transformed states (all zero when ``source_view`` is off)."""
        # zeros_like + expand, not torch.zeros(..., device=): a traced graph must hold no device constant
        source = torch.zeros_like(hidden[:, 0, :1]).expand(-1, self.source_vocab_size)
        if not self.source_view:
            return source
        echo = torch.log1p(torch.relu(self.echo(hidden).squeeze(-1))) * attention_mask.to(hidden.dtype)
        echo = echo * self.source_keep[input_ids]
        # max over the positions holding each input id (weights >= 0, so the zero start is neutral)
        return source.scatter_reduce(1, input_ids, echo, reduce="amax", include_self=True)

    def views(self, token_embeddings: torch.Tensor, attention_mask: torch.Tensor,
              input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(source [B, V_src], pivot [B, V_en])`` for a batch of encoder token states."""
        hidden = self.pivot_hidden(token_embeddings)
        if self.pivot_pool is not None:  # max_t log1p(relu(z_t)) = log1p(relu(max_t z_t)), chunked over the vocabulary
            pivot = self.pivot_pool(hidden, attention_mask, self.decoder.weight, self.decoder.bias, "relu") * self.pivot_keep
        else:
            pivot = self.pivot_from_logits(self.pooled_logits(hidden, attention_mask))
        return self.source_from_hidden(hidden, attention_mask, input_ids), pivot

    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        source, pivot = self.views(features["token_embeddings"], features["attention_mask"], features["input_ids"])
        features["sentence_embedding"] = torch.cat([source, pivot], dim=1)
        return features

    def get_embedding_dimension(self) -> int:
        return self.source_vocab_size + self.pivot_vocab_size

    # ------------------------------------------------------------------ English head from a SPLADE model

    @torch.no_grad()
    def load_pivot_head(self, mlm: nn.Module) -> None:
        """Copy the English MLM head (transform + decoder) of ``mlm`` (BERT- or DistilBERT-style ForMaskedLM)."""
        if hasattr(mlm, "cls") and hasattr(mlm.cls, "predictions"):  # BertForMaskedLM
            pred = mlm.cls.predictions
            dense, norm = pred.transform.dense, pred.transform.LayerNorm
            act = getattr(mlm.config, "hidden_act", "gelu")
        elif hasattr(mlm, "vocab_transform"):  # DistilBertForMaskedLM
            dense, norm = mlm.vocab_transform, mlm.vocab_layer_norm
            act = getattr(mlm.config, "activation", "gelu")
        else:
            raise ValueError(f"the sparse head must be a BERT- or DistilBERT-style masked LM, got {type(mlm).__name__}")
        if act != "gelu":
            raise ValueError(f"the sparse head's MLM transform uses {act!r}; only 'gelu' is supported")
        decoder = mlm.get_output_embeddings()
        if decoder.weight.shape != self.decoder.weight.shape:
            raise ValueError(f"decoder shape {tuple(decoder.weight.shape)} != head {tuple(self.decoder.weight.shape)}")
        self.transform[0].load_state_dict(dense.state_dict())
        self.transform[2].load_state_dict(norm.state_dict())
        self.transform[2].eps = float(norm.eps)
        self.decoder.weight.copy_(decoder.weight)
        bias = decoder.bias if decoder.bias is not None else getattr(mlm.cls.predictions, "bias", None)
        self.decoder.bias.copy_(bias if bias is not None else torch.zeros_like(self.decoder.bias))

    def trainable_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameter groups by part: ``connector``, ``echo``, ``pivot_head`` (transform + decoder)."""
        return {"connector": list(self.connector.parameters()), "echo": list(self.echo.parameters()),
                "pivot_head": list(self.transform.parameters()) + list(self.decoder.parameters())}

    # ------------------------------------------------------------------ save / load

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=safe_serialization)
        if self.pivot_tokenizer is not None:
            self.pivot_tokenizer.save_pretrained(os.path.join(output_path, PIVOT_TOKENIZER_DIR))

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs) -> "LexEchoHead":
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        head = cls(**cls.load_config(model_name_or_path, **hub))
        cls.load_torch_weights(model_name_or_path, model=head, **hub)
        local = cls.load_dir_path(model_name_or_path, **hub)
        if local and (Path(local) / PIVOT_TOKENIZER_DIR).is_dir():
            from transformers import AutoTokenizer

            head.pivot_tokenizer = AutoTokenizer.from_pretrained(str(Path(local) / PIVOT_TOKENIZER_DIR))
        return head

    def __repr__(self) -> str:
        return f"LexEchoHead({json.dumps(self.get_config_dict())[:200]})"


class MilcoEncodingModule(nn.Module):
    """The MILCO document encoder as ML Commons calls a TorchScript sparse model: one dict
    ``{"input_ids", "attention_mask"}`` in, ``{"output": float32 [B, V_src + V_en]}`` out.

    The additive attention mask is built from the input inside the graph (no device constant), as
    :mod:`opensearch_lsr.opensearch.trace` does for MLM models.
    """

    def __init__(self, encoder: nn.Module, head: LexEchoHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:  # noqa: A002 - DJL's name
        input_ids = input["input_ids"]
        attention_mask = input["attention_mask"]
        extended = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        # explicit token types: the embeddings' buffered default is moved with a device constant when traced
        hidden = self.encoder(input_ids=input_ids, attention_mask=extended, token_type_ids=torch.zeros_like(input_ids),
                              return_dict=False)[0]
        source, pivot = self.head.views(hidden, attention_mask, input_ids)
        return {"output": torch.cat([source, pivot], dim=1).to(torch.float32)}
