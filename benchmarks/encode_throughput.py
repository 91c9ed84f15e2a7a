"""Document-encoding throughput: SparseDocumentEncoder vs sentence-transformers vs a naive loop.

All figures come from the same run, on the same texts, model, batch size and device:

* ``naive``: ``AutoModelForMaskedLM`` logits ``[B, L, V]`` + mask + log1p(relu) + max, per batch.
* ``st``: ``SparseEncoder.encode_document`` (sentence-transformers), the reference numbers.
* ``ours``: :class:`opensearch_lsr.encoding.encoder.SparseDocumentEncoder` (fp32 on CPU).

It checks that ours equals sentence-transformers within 1e-5 (non-special dims) and, with
``--reduced``, runs the bf16 path and reports MRR@10 on the dev split for fp32 vs bf16 (exact
in-memory retrieval, ``opensearch_lsr.evaluation``). With ``--e2e`` it also times encode + load into
the local backend and into the OpenSearch HTTP test double (``tests/opensearch/double``) with the
real ``lsr-os index`` job, as a share of encode-only throughput.

    python benchmarks/encode_throughput.py --limit 256 --threads 2 [--model /tmp/ko_sembridge] [--e2e] [--reduced]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _texts(limit: int | None) -> tuple[list[str], list[str]]:
    from opensearch_lsr.evaluation.datasets import doc_text
    from opensearch_lsr.resources import shared_data_dir

    data = shared_data_dir()
    if data is None:
        sys.exit("the shared msmarco-ko data is not present")
    ids, texts = [], []
    with open(data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            ids.append(row["_id"])
            texts.append(doc_text(row))
            if limit and len(texts) >= limit:
                break
    return ids, texts


def _naive(model_dir: str, texts: list[str], batch_size: int) -> tuple[torch.Tensor, float]:
    from transformers import AutoModelForMaskedLM

    from opensearch_lsr.transfer.surgery import load_target_tokenizer, resolve_model_path

    path = resolve_model_path(model_dir)
    tok = load_target_tokenizer(path)
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    out = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(texts), batch_size):
            b = tok(texts[s:s + batch_size], padding=True, truncation=True, max_length=512, return_tensors="pt")
            logits = model(**b).logits
            out.append(torch.log1p(torch.relu(logits * b["attention_mask"].unsqueeze(-1))).amax(1))
    return torch.cat(out), time.perf_counter() - t0


def _st(model_dir: str, texts: list[str], batch_size: int) -> tuple[torch.Tensor, float]:
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    st = load_sparse_encoder(model_dir)
    t0 = time.perf_counter()
    emb = st.encode_document(texts, batch_size=batch_size, convert_to_tensor=True)
    dt = time.perf_counter() - t0
    return (emb.to_dense() if emb.is_sparse else emb).float(), dt


def _e2e(model_dir: str, texts: list[str], ids: list[str], batch_size: int, encoder) -> dict:
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job

    sys.path.insert(0, str(ROOT / "tests" / "opensearch"))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"_id": i, "text": t}, ensure_ascii=False) + "\n"
                                  for i, t in zip(ids, texts)), encoding="utf-8")
        t0 = time.perf_counter()
        encoder.encode(texts)
        out["encode_only_docs_per_s"] = len(texts) / (time.perf_counter() - t0)
        cfg = IndexJobConfig(corpus=str(corpus), model=model_dir, backend="local", index=str(Path(tmp) / "local"),
                             batch_size=batch_size)
        s = run_index_job(cfg, encoder=encoder, progress=False)
        out["local_docs_per_s"] = s["this_run"]["docs_per_s"]
        try:
            from double.server import OpenSearchDouble  # H-cluster's HTTP test double
        except ImportError:
            OpenSearchDouble = None
        if OpenSearchDouble is not None:
            from opensearch_lsr.opensearch.client import make_client

            double = OpenSearchDouble().start()
            try:
                client = make_client(double.url)
                client.indices.create(index="bench", body={"mappings": {"properties": {
                    "id": {"type": "keyword"}, "text": {"type": "text"}, "sparse_embedding": {"type": "rank_features"}}}})
                cfg = IndexJobConfig(corpus=str(corpus), model=model_dir, backend="opensearch", index="bench",
                                     batch_size=batch_size, work_dir=str(Path(tmp) / "osjob"))
                s = run_index_job(cfg, encoder=encoder, client_factory=lambda: client, progress=False)
                out["double_docs_per_s"] = s["this_run"]["docs_per_s"]
                out["double_indexed"] = s["indexed"]
            finally:
                double.stop() if hasattr(double, "stop") else None
    for k in ("local", "double"):
        if f"{k}_docs_per_s" in out:
            out[f"{k}_share_of_encode_only"] = out[f"{k}_docs_per_s"] / out["encode_only_docs_per_s"]
    return out


def _mrr(model_dir: str, precision: str, batch_size: int) -> float:
    """MRR@10 on msmarco-ko dev with our encoder at ``precision`` (docs) and the same queries."""
    import numpy as np
    import scipy.sparse as sp

    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from opensearch_lsr.evaluation.retrieval import top_k_run
    from opensearch_lsr.resources import shared_data_dir

    ds = load_beir(shared_data_dir() / "msmarco-ko", "dev")
    enc = SparseDocumentEncoder(model_dir, device="cpu", precision=precision, batch_size=batch_size)
    dids, qids = list(ds.corpus), list(ds.queries)

    def csr(texts):
        rows = enc.encode(texts)
        data = np.concatenate([r.weights for r in rows]) if rows else np.zeros(0, np.float32)
        ind = np.concatenate([r.ids for r in rows]) if rows else np.zeros(0, np.int64)
        ptr = np.concatenate([[0], np.cumsum([len(r.ids) for r in rows])])
        return sp.csr_matrix((data, ind, ptr), shape=(len(rows), enc.vocab_size))

    run = top_k_run(csr([ds.queries[q] for q in qids]), csr([ds.corpus[d] for d in dids]), qids, dids, k=100)
    return float(evaluate_run(ds.qrels, run)["mrr@10"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="splade-tiny")
    ap.add_argument("--limit", type=int, default=256, help="corpus passages (0 = all 7,279)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--e2e", action="store_true", help="also time encode+load (local backend, test double)")
    ap.add_argument("--reduced", action="store_true", help="bf16 path: max |diff| and dev MRR@10 vs fp32 (slow)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder

    ids, texts = _texts(args.limit or None)
    enc = SparseDocumentEncoder(args.model, device="cpu", precision="fp32", batch_size=args.batch_size)
    enc.encode(texts[: args.batch_size])  # warm-up
    result = {"model": args.model, "docs": len(texts), "batch_size": args.batch_size, "threads": args.threads,
              "device": "cpu", "gpu": torch.cuda.is_available()}
    t0 = time.perf_counter()
    ours = enc.encode_dense(texts)
    result["ours_s"] = time.perf_counter() - t0
    ref, result["st_s"] = _st(args.model, texts, args.batch_size)
    keep = torch.ones(ref.shape[1], dtype=torch.bool)
    keep[enc.special_ids] = False
    result["max_abs_diff_vs_st"] = float((ours[:, keep] - ref[:, keep]).abs().max())
    if not args.skip_naive:
        naive, result["naive_s"] = _naive(args.model, texts, args.batch_size)
        result["naive_docs_per_s"] = len(texts) / result["naive_s"]
    for k in ("ours", "st"):
        result[f"{k}_docs_per_s"] = len(texts) / result[f"{k}_s"]
    result["speedup_vs_st"] = result["st_s"] / result["ours_s"]
    if "naive_s" in result:
        result["speedup_vs_naive"] = result["naive_s"] / result["ours_s"]
    if args.e2e:
        result["e2e"] = _e2e(args.model, texts, ids, args.batch_size, enc)
    if args.reduced:
        bf = SparseDocumentEncoder(args.model, device="cpu", precision="bf16", batch_size=args.batch_size)
        t0 = time.perf_counter()
        low = bf.encode_dense(texts)
        result["bf16_docs_per_s"] = len(texts) / (time.perf_counter() - t0)
        result["bf16_max_abs_diff"] = float((low - ours).abs().max())
        result["mrr10_fp32"] = _mrr(args.model, "fp32", args.batch_size)
        result["mrr10_bf16"] = _mrr(args.model, "bf16", args.batch_size)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
