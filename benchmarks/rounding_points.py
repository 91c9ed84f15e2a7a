"""Where half precision's distance to fp32 comes from: each rounding point of the packed forward, alone or together.

``precision_distance.py`` measures the settings the encoder runs (bf16, bf16 with an fp16 head, fp16). This one
takes them apart. The packed BERT forward (``packed_layouts.packed_model``'s layout: post-LN blocks, the residual
stream and LayerNorms in fp32) runs in fp32, and chosen tensors are rounded to bf16 or fp16 and back where a
card's half-precision kernels round them:
``weights`` (every linear layer's weights and biases), ``inputs`` (what each matmul reads: the LayerNorm outputs,
the attention context, the activated feed-forward), ``outputs`` (what each matmul writes), ``attention`` (q, k, v
and the softmax probabilities) and ``head`` (the head's transform and decoder: weights, input, hidden state).
Tensor cores accumulate in fp32, so the rounding of their inputs and outputs is the whole difference (up to the
order of the sums). Each setting's vectors are compared with fp32's (``gpu_encode.exactness``). Some settings
are probes no card runs as such (fp16 weights beside bf16 activations): they say which rounding matters.

    python benchmarks/rounding_points.py [--model splade-tiny | bert-base-random | DIR] [--limit 40] [--out F.json]

``--mrr``: the whole dev corpus of ``--dataset`` (MS MARCO-ko by default; msmarco-en is where ``gpu_encode.py``
judges SPLADE-tiny's MRR) instead of ``--limit`` passages, and each setting's dev MRR@10 beside fp32's (queries in
fp32, exact dot-product retrieval: ``gpu_encode.dev_mrr``).

BERT-family masked LMs only (``BertForMaskedLM``); ``bert-base-random`` is ``gpu_encode.py``'s BERT-base shape.
Written by hand because no library emulates a mixed-precision forward point by point.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files
from gpu_encode import dev_mrr, dev_set, exactness, load_corpus, named_model  # noqa: E402

POINTS = ("weights", "inputs", "outputs", "attention", "head")
BF16, FP16 = torch.bfloat16, torch.float16
ALL_BF16 = dict.fromkeys(POINTS, BF16)
#: setting -> the dtype each rounding point is rounded to (absent: kept in fp32)
SETTINGS: dict[str, dict[str, torch.dtype]] = {
    "bf16 everywhere": ALL_BF16,
    "fp16 everywhere": dict.fromkeys(POINTS, FP16),
    "bf16, head fp16 (--precision bf16 on CUDA)": {**ALL_BF16, "head": FP16},
    "bf16, head fp16, matmul outputs fp32": {k: v for k, v in {**ALL_BF16, "head": FP16}.items() if k != "outputs"},
    "bf16, head fp16, weights fp16": {**ALL_BF16, "head": FP16, "weights": FP16},
    "bf16, head fp16, matmul inputs fp16": {**ALL_BF16, "head": FP16, "inputs": FP16},
    **{f"only {point} bf16": {point: BF16} for point in POINTS},
}


def _round(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t if dtype is None else t.to(dtype).float()


def emulated(fp32: Any, hf_model: Any, rounding: dict[str, torch.dtype]) -> Any:
    """A copy of the fp32 :class:`~opensearch_lsr.encoding.packed.PackedMLM` ``fp32`` whose forward rounds the
    tensors of ``rounding``'s points (the head from ``hf_model``'s own fp32 weights)."""
    w, a, o, q, h = (rounding.get(k) for k in POINTS)
    layers = [layer._replace(**{name: _round(getattr(layer, name), w) for name in (
        "qkv_w", "qkv_b", "out_w", "out_b", "up_w", "up_b", "down_w", "down_b")}) for layer in fp32.layers]
    pred = hf_model.cls.predictions.transform
    dense_w, dense_b = _round(pred.dense.weight.detach(), h), _round(pred.dense.bias.detach(), h)
    norm = pred.LayerNorm

    def linear(x, weight, bias):
        return _round(F.linear(_round(x, a), weight, bias), o)

    def attend(qkv, seg):
        out = torch.empty_like(qkv[:, 0])
        bounds = seg.cu_seqlens.tolist()
        for s, e in itertools.pairwise(bounds):  # per document, heads first
            qd, kd, vd = (_round(qkv[s:e, i], q).transpose(0, 1) for i in range(3))
            probs = torch.softmax(qd @ kd.transpose(1, 2) / qd.shape[-1] ** 0.5, dim=-1)
            out[s:e] = (_round(probs, q) @ vd).transpose(0, 1)
        return _round(out, o)

    def hidden(self, ids, seg, _attend=None):
        x = F.embedding(ids, self.word) + F.embedding(seg.positions + self.position_offset, self.position)
        if self.token_type is not None:
            x = x + self.token_type
        x = F.layer_norm(x, x.shape[-1:], *self.emb_ln[:2], self.emb_ln[2])
        total, width = x.shape
        for layer in layers:
            ctx = attend(linear(x, layer.qkv_w, layer.qkv_b).view(total, 3, self.heads, width // self.heads), seg)
            x = F.layer_norm(x + linear(ctx.reshape(total, width), layer.out_w, layer.out_b), (width,), *layer.ln1)
            up = layer.act(linear(x, layer.up_w, layer.up_b))
            x = F.layer_norm(x + linear(up, layer.down_w, layer.down_b), (width,), *layer.ln2)
        y = pred.transform_act_fn(F.linear(_round(x, h), dense_w, dense_b))
        return _round(F.layer_norm(_round(y, h), (width,), norm.weight.float(), norm.bias.float(), norm.eps), h)

    model = copy.copy(fp32)
    model._hidden = hidden.__get__(model)
    model.decoder_t = [_round(chunk, h) for chunk in fp32.decoder_t]
    model.decoder_b = _round(fp32.decoder_b, h) if fp32.decoder_b is not None else None
    return model


def measure(model: str, texts: list[str], settings: list[str], dev: tuple | None = None) -> dict:
    """fp32 vectors of ``texts`` and each setting's distance to them; with ``dev`` (query ids, query texts, the
    ids of ``texts``, judgements) each one's dev MRR@10 too."""
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.packed_runner import PackedRunner

    enc = SparseDocumentEncoder(model, device="cpu", precision="fp32", batching="packed", compile=False)
    if type(enc.model).__name__ != "BertForMaskedLM" or enc.runner is None:
        raise SystemExit(f"{model}: rounding_points.py emulates BertForMaskedLM only")
    tokens = enc.once_tokenizer(texts)

    def run(packed):
        return PackedRunner(packed, activation=enc.activation, max_batch_tokens=enc.runner.max_batch_tokens,
                            special_ids=enc.special_ids if enc.zero_special_tokens else []).run(tokens)

    reference = run(enc.runner.model)
    out: dict = {"docs": len(texts), "tokens": int(tokens.lengths.sum()), "rows": {}}
    if dev is not None:
        qids, query_texts, doc_ids, qrels = dev
        queries = enc.encode(query_texts)

        def mrr(documents: list) -> float:
            return dev_mrr(queries, documents, qids, doc_ids, qrels, enc.vocab_size)

        out.update(queries=len(qids), fp32_mrr_at_10=mrr(reference))
    for name in settings:
        t0 = time.perf_counter()
        vectors = run(emulated(enc.runner.model, enc.model, SETTINGS[name]))
        out["rows"][name] = {"rounded": {k: str(v).removeprefix("torch.") for k, v in SETTINGS[name].items()},
                             "seconds": round(time.perf_counter() - t0, 2), **exactness(reference, vectors)}
        if dev is not None:
            out["rows"][name]["mrr_at_10"] = mrr(vectors)
    return out


def markdown(result: dict) -> str:
    with_mrr = "fp32_mrr_at_10" in result
    rows = [[name, r["jaccard_mean"], r["jaccard_min"], r["max_abs_dw"], r["max_unshared_weight"],
             f"{r['identical_id_sets']} / {r['docs']}", *([r["mrr_at_10"]] if with_mrr else [])]
            for name, r in result["rows"].items()]
    mrr = (f"Dev MRR@10 over {result['queries']:,} queries (queries in fp32): fp32 documents "
           f"{result['fp32_mrr_at_10']}.\n\n" if with_mrr else "")
    return (f"# Rounding points against fp32: {result['model']}, {result['docs']} passages of "
            f"{result.get('dataset', 'msmarco-ko')} "
            f"({result['tokens']:,} tokens), fp32 with tensors rounded where a card rounds them\n\n" + mrr
            + harness.markdown_table(["setting (rest fp32)", "Jaccard mean", "Jaccard min", "max |dw|",
                                      "largest weight one side lacks", "identical id sets",
                                      *(["dev MRR@10"] if with_mrr else [])], rows, ".4g") + "\n")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert-base-random",
                   help="bert-base-random (gpu_encode.py's), splade-tiny (the installed one) or a model directory.")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="The shared data folder.")
    p.add_argument("--limit", type=int, default=40, help="Passages (the corpus's first ones).")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS), metavar="SETTING",
                   help=f"Which settings (default: all): {'; '.join(SETTINGS)}.")
    p.add_argument("--mrr", action="store_true",
                   help="The whole dev corpus of --dataset (not --limit passages) and each setting's dev MRR@10.")
    p.add_argument("--dataset", default="msmarco-ko", choices=["msmarco-ko", "msmarco-en"],
                   help="The BEIR folder under --data whose passages are encoded.")
    p.add_argument("--out", default=None, help="JSON results file (the markdown table goes next to it as .md).")
    args = p.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    data = Path(args.data)
    _, corpus = load_corpus(data / args.dataset / "corpus.jsonl", 1, max(args.limit, 128))
    texts, dev = corpus[:args.limit], None
    if args.mrr:
        documents, queries, qrels = dev_set(data / args.dataset)
        texts = [d["text"] for d in documents]
        dev = (list(queries), list(queries.values()), [d["_id"] for d in documents], qrels)
    with tempfile.TemporaryDirectory() as tmp:
        model = named_model(args.model, data, corpus[:128], Path(tmp), torch.device("cpu"))
        result = {"model": args.model, "dataset": args.dataset, **measure(model, texts, args.settings, dev)}
    return harness.publish(result, markdown(result), args.out)


if __name__ == "__main__":
    main()
