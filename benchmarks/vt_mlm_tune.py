"""VT MLM-adaptation diagnosis: why the frozen-body MLM phase hurt, and which setting doesn't.

    nice python benchmarks/vt_mlm_tune.py --out runs/vt_mlm_tune --threads 1 \
        --setting lr=2e-3 --setting lr=1e-4 --setting lr=3e-4 --setting lr=2e-3,train_bias=0

Starts from one VT ``semantic`` model (no MLM; ``--base``), runs :func:`adapt_embeddings` on the Korean
corpus passages (never dev queries) for each setting, and reports for each: first/last loss, whether
every body tensor is bit-identical afterwards (frozen body), the drift of the embedding rows and bias,
the APC probe's activation rate and active dims, and MRR@10 / nDCG@10 on a small dev subset
(``--max-queries`` judged queries, ``--max-docs`` passages; absolute scores on a subset are higher than
on the full corpus, so compare rows of this script only). The no-MLM base is measured in the same run
as the baseline. Each setting is cached in ``<out>/<setting>.json`` (resumable); the summary of all rows goes to
``<out>/summary.json`` with the run's date, commit, command and machine.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

import torch

from harness import load_dataset, set_threads, write_results

from opensearch_lsr.config import read_json, write_json
from opensearch_lsr.resources import shared_data_dir
from opensearch_lsr.transfer.adaptation import adapt_embeddings, trainable_vocab_parameters
from opensearch_lsr.transfer.apc import probe_activations
from opensearch_lsr.transfer.surgery import load_source_model, mlm_parts, save_sparse_encoder
from opensearch_lsr.corpus import iter_corpus_texts
from opensearch_lsr.transfer.vocab import find_overlap

from vt_table import evaluate_shifts, subset_dataset


def parse_setting(text: str) -> dict:
    out = {"lr": 2e-3, "steps": 200, "train_bias": 1, "weight_decay_to_init": 0.0, "optimizer": "adamw"}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in out:
            raise SystemExit(f"unknown setting key {key!r}; allowed: {', '.join(out)}")
        out[key] = type(out[key])(value) if key != "optimizer" else value
    return out


def measure(model_dir: Path, dataset, probe_docs, probe_queries, args) -> dict:
    model, tok = load_source_model(str(model_dir))
    probe = probe_activations(model, tok, probe_docs, probe_queries, max_length=args.max_length, seed=args.seed)
    row = {"rate": probe.rate(0.0), "probe_doc_dims": probe.doc_active_dims(0.0),
           "probe_query_dims": probe.query_active_dims(0.0)}
    t0 = time.perf_counter()
    row.update(evaluate_shifts(model_dir, dataset, [0.0])[0])
    row["eval_s"] = round(time.perf_counter() - t0, 1)
    return row


def promote(out: Path, name: str, base: Path, dest: Path, batch_size: int, max_length: int, seed: int) -> None:
    """Copy tuned model ``name`` to ``dest`` with a ``transfer_config.json`` that says how it was made.

    The tuned model is what ``vt_transfer`` builds for the same base and settings (same init, corpus,
    seed, per-step batches), so ``vt_table.py`` can evaluate it as its ``-mlm`` variant without re-training.
    """
    import shutil

    row = read_json(out / f"{name}.json")
    cfg = read_json(base / "transfer_config.json")
    setting = row["setting"]
    cfg.update({"out": str(dest), "mlm_steps": setting["steps"], "lr": setting["lr"], "batch_size": batch_size,
                "max_length": max_length, "seed": seed, "mlm_optimizer": setting["optimizer"],
                "mlm_train_bias": bool(setting["train_bias"]),
                "adaptation": {"steps": setting["steps"], "first_loss": row["first_loss"],
                               "final_loss": row["final_loss"], "seconds": row["mlm_s"],
                               "body_bit_identical": row["body_bit_identical"]},
                "promoted_from": str(out / "models" / name)})
    shutil.copytree(out / "models" / name, dest, dirs_exist_ok=True)
    if (base / "alignment.npz").exists():  # MLM changes no alignment: the base's is the model's
        shutil.copyfile(base / "alignment.npz", dest / "alignment.npz")
    write_json(dest / "transfer_config.json", cfg)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/vt_mlm_tune")
    ap.add_argument("--base", default="runs/bench_vt_full/models/ko-semantic")
    ap.add_argument("--setting", action="append", default=[],
                    help="comma list of lr=,steps=,train_bias=0|1,optimizer=adamw|sgd")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=96)
    ap.add_argument("--max-queries", type=int, default=300)
    ap.add_argument("--max-docs", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--promote", nargs=2, metavar=("SETTING", "DEST"), default=None,
                    help="copy a finished setting's model to DEST as a VT -mlm model dir, then exit")
    args = ap.parse_args(argv)
    if args.promote:
        name = args.promote[0].replace("=", "").replace(",", "_")
        promote(Path(args.out), name, Path(args.base), Path(args.promote[1]), args.batch_size, args.max_length,
                args.seed)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = shared_data_dir()
    dataset = subset_dataset(load_dataset(data / "msmarco-ko"), args.max_queries, args.max_docs, args.seed)
    corpus = [t for t in iter_corpus_texts(data / "msmarco-ko") if t.strip()]
    probe_docs = random.Random(args.seed).sample(corpus, 128)
    probe_queries = [" ".join(t.split()[:8]) for t in probe_docs]
    base = Path(args.base)

    rows = {}
    if (out / "base.json").exists():
        rows["base"] = read_json(out / "base.json")
    else:
        rows["base"] = measure(base, dataset, probe_docs, probe_queries, args)
        write_json(out / "base.json", rows["base"])
    for text in args.setting:
        name = text.replace("=", "").replace(",", "_")
        path = out / f"{name}.json"
        if path.exists():
            rows[name] = read_json(path)
            continue
        cfg = parse_setting(text)
        model, tok = load_source_model(str(base))
        parts = mlm_parts(model)
        emb0 = parts.input_embeddings.weight.detach().clone()
        bias0 = parts.output_bias.detach().clone()
        body0 = {n: p.detach().clone() for n, p in model.named_parameters()
                 if all(p is not q for q in trainable_vocab_parameters(model))}
        _, source_tok = load_source_model("splade-tiny")
        is_new = torch.ones(len(tok), dtype=torch.bool)
        is_new[list(find_overlap(source_tok, tok))] = False
        res = adapt_embeddings(model, tok, corpus, is_new, steps=cfg["steps"], batch_size=args.batch_size,
                               max_length=args.max_length, lr=cfg["lr"], seed=args.seed,
                               train_bias=bool(cfg["train_bias"]), optimizer=cfg["optimizer"],
                               show_progress=False)
        after = dict(model.named_parameters())
        body_identical = all(torch.equal(after[n].detach(), t) for n, t in body0.items())
        emb1 = mlm_parts(model).input_embeddings.weight.detach()
        row = {"setting": cfg, "first_loss": res.first_loss, "final_loss": res.final_loss,
               "mlm_s": res.seconds, "body_bit_identical": body_identical,
               "emb_rel_drift": float((emb1 - emb0).norm() / emb0.norm()),
               "emb_rel_drift_overlap": float((emb1 - emb0)[~is_new].norm() / emb0[~is_new].norm()),
               "bias_mean_shift": float((mlm_parts(model).output_bias.detach() - bias0).mean())}
        mdir = out / "models" / name
        save_sparse_encoder(model, tok, mdir)
        row.update(measure(mdir, dataset, probe_docs, probe_queries, args))
        write_json(path, row)
        rows[name] = row
        logging.info("%s: %s", name, {k: row[k] for k in ("final_loss", "rate", "mrr@10")})
    summary = {k: {kk: v.get(kk) for kk in ("first_loss", "final_loss", "body_bit_identical", "emb_rel_drift",
                                            "emb_rel_drift_overlap", "bias_mean_shift", "rate", "probe_doc_dims",
                                            "mrr@10", "ndcg@10")}
               for k, v in rows.items()}
    print(json.dumps(summary, indent=1))
    write_results(out / "summary", {"rows": summary})


if __name__ == "__main__":
    sys.exit(main())
