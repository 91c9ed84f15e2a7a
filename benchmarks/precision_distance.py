"""How far bf16 and fp16 documents lie from fp32 ones, on the Korean passages.

The packed path's vectors in each half precision against its own fp32 vectors over the same tokenized texts:
identical id sets, max |dw| on shared ids, active-set Jaccard (``gpu_encode.exactness``), and non-finite weights
dropped (an fp16 overflow shows there). bf16 keeps fp32's exponent and 8 significant bits; fp16 has 11, and tops
out at 65,504. Three settings: ``bf16`` throughout, ``bf16-fp16-head`` (the body in bf16, the MLM head's
transform and decoder in fp16: what bf16 runs on CUDA, ``packed_layouts.default_head_dtype``) and ``fp16``
throughout.

The encoder refuses fp16 on CPU, where no native fp16 matmul exists on most machines: it runs emulated, two orders
of magnitude slower than fp32. So this script builds each precision's packed model itself, with the classes the
encoder runs (``packed_layouts.packed_model``, ``PackedRunner``), eager (no ``torch.compile``). The CPU answers
the question of rounding before a card is at hand; on CUDA the same script measures the card's kernels, and
``gpu_encode.py`` reports fp16 against fp32 for the compiled default as well.

    python benchmarks/precision_distance.py [--model splade-tiny | bert-base-random | DIR] [--limit 120]
                                            [--precisions bf16 bf16-fp16-head fp16] [--device cpu] [--out F.json]

``bert-base-random`` is ``gpu_encode.py``'s BERT-base-shaped model (12 x 768, the Korean vocabulary, random weights
from seed 0, the decoder bias shifted on the corpus's first 128 passages), so the same model its card runs time.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files
from gpu_encode import NEAR_ZERO, exactness, load_corpus, named_model, near_zero_per_doc  # noqa: E402

#: (body, MLM head) dtypes of each setting
DTYPES = {"fp32": (torch.float32, torch.float32), "bf16": (torch.bfloat16, torch.bfloat16),
          "bf16-fp16-head": (torch.bfloat16, torch.float16), "fp16": (torch.float16, torch.float16)}


def distances(model: str, texts: list[str], device: str, precisions: list[str]) -> dict:
    """fp32 vectors of ``texts`` and each other precision's distance to them (seconds per precision too)."""
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.packed_layouts import packed_model
    from opensearch_lsr.encoding.packed_runner import PackedRunner

    enc = SparseDocumentEncoder(model, device=device, precision="fp32", batching="packed", compile=False)
    if enc.runner is None:
        raise SystemExit(f"{model}: no packed layout for this model")
    tokens = enc.once_tokenizer(texts)
    model_fp32 = enc.runner.model
    out: dict = {"docs": len(texts), "tokens": int(tokens.lengths.sum()), "rows": {}}
    # how many ids per document a small rounding error can flip: fp32 pooled logits within NEAR_ZERO of zero
    out["fp32_logits_near_zero_per_doc"] = near_zero_per_doc(enc, texts)
    vectors = {}
    for name in ["fp32", *precisions]:
        body, head = DTYPES[name]
        packed = model_fp32 if name == "fp32" else packed_model(
            enc.model, body, vocab_chunk=model_fp32.vocab_chunk, segment_max=model_fp32.segment_max,
            row_block=model_fp32.row_block, compile=False, head_dtype=head)
        runner = PackedRunner(packed, activation=enc.activation,
                              special_ids=enc.special_ids if enc.zero_special_tokens else [],
                              max_batch_tokens=enc.runner.max_batch_tokens)
        t0 = time.perf_counter()
        vectors[name] = runner.run(tokens)
        row = out["rows"][name] = {"seconds": round(time.perf_counter() - t0, 2),
                                   "nonfinite_dropped": runner.stats.nonfinite_dropped,
                                   "mean_nonzeros": round(sum(len(v.ids) for v in vectors[name]) / len(texts), 1)}
        if name != "fp32":
            row["vs_fp32"] = exactness(vectors["fp32"], vectors[name])
    return out


def markdown(result: dict) -> str:
    rows = []
    for name, row in result["rows"].items():
        d = row.get("vs_fp32") or {}
        rows.append([name, row["seconds"], row["mean_nonzeros"], row["nonfinite_dropped"],
                     f"{d['identical_id_sets']} / {d['docs']}" if d else "-", d.get("max_abs_dw"),
                     d.get("max_unshared_weight"), d.get("jaccard_mean"), d.get("jaccard_min")])
    return (f"# bf16 and fp16 documents against fp32: {result['model']}, {result['docs']} Korean passages "
            f"({result['tokens']:,} tokens), {result['device']}\n\n"
            f"fp32 pooled logits within {NEAR_ZERO} of zero (the ids a small rounding error can flip): "
            f"{result['fp32_logits_near_zero_per_doc']} per document.\n\n"
            + harness.markdown_table(["precision", "seconds", "ids per doc", "non-finite dropped",
                                      "identical id sets", "max |dw|", "largest weight one side lacks",
                                      "Jaccard mean", "Jaccard min"], rows, ".4g")
            + "\n")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="splade-tiny",
                   help="splade-tiny (the installed one), bert-base-random (gpu_encode.py's) or a model directory.")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="The shared data folder.")
    p.add_argument("--limit", type=int, default=120, help="Passages (the corpus's first ones).")
    p.add_argument("--device", default="cpu", help="cpu or cuda.")
    p.add_argument("--precisions", nargs="+", default=["bf16", "bf16-fp16-head", "fp16"],
                   choices=["bf16", "bf16-fp16-head", "fp16"],
                   help="Settings besides fp32 (bf16-fp16-head: the body in bf16, the MLM head in fp16).")
    p.add_argument("--out", default=None, help="JSON results file (the markdown table goes next to it as .md).")
    args = p.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    data = Path(args.data)
    _, corpus = load_corpus(data / "msmarco-ko" / "corpus.jsonl", 1, max(args.limit, 128))
    texts = corpus[:args.limit]
    with tempfile.TemporaryDirectory() as tmp:
        model = named_model(args.model, data, corpus[:128], Path(tmp), torch.device(args.device))
        result = {"model": args.model, "device": args.device,
                  **distances(model, texts, args.device, args.precisions)}
    return harness.publish(result, markdown(result), args.out)


if __name__ == "__main__":
    main()
