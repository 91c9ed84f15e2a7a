"""How the embedded local index grows: index time, query latency and memory at 200k, 1M, 5M documents.

Documents are synthetic sparse vectors indexed through the real public path (``LocalIndex.bulk``,
the call ``LocalEngine.bulk`` / ``lsr-os index --backend local`` make), queried through
``LocalIndex.search`` with ``neural_sparse`` ``query_tokens`` bodies. Every phase is a separate,
resumable process so that each holds the shared heavy-job lock for less than ~15 minutes and so
that its peak resident memory (``VmHWM``) is its own::

    # one index grows through the sizes: build to 200k, query, build on to 1M, query, on to 5M, ...
    python benchmarks/local_scale.py build --docs 200000 --index runs/local_scale/idx --max-minutes 13
    python benchmarks/local_scale.py query --index runs/local_scale/idx --queries 300
    python benchmarks/local_scale.py build --docs 1000000 --index runs/local_scale/idx --max-minutes 13
    ...
    python benchmarks/local_scale.py merge --index runs/local_scale/idx          # force-merge at the end
    python benchmarks/local_scale.py query --index runs/local_scale/idx --tag merged
    python benchmarks/local_scale.py report --index runs/local_scale/idx --out benchmarks/results/scale/local.md
    # how realistic the synthetic vectors are: their statistics next to SPLADE-tiny's on MS MARCO passages
    python benchmarks/local_scale.py stats --passages 2000

``build`` is resumable (re-run the same command until it prints "done"); documents are generated
deterministically by position, so the first 1M documents of the 5M index are those of the 1M one
and a size's index time is the cumulative bulk time up to it.

The synthetic distribution (:func:`synthetic_batch`): term ids drawn with replacement from a Zipf law
(``p(rank r) ~ r^-s``) over a 30,522-term vocabulary (BERT uncased, what SPLADE models use) until a
log-normal number of distinct terms (median ~150) is reached; weights log-normal. ``stats`` prints
the same statistics (active terms per document, document frequency of the most frequent terms,
weight quantiles) for the synthetic vectors and for a real SPLADE model's document vectors.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from harness import describe, markdown_table, run_info, set_threads, time_call, write_json

VOCAB = 30_522
FIELD = "sparse_embedding"


# ---- synthetic vectors ----------------------------------------------------------------------------

def _zipf_cdf(vocab: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** s
    return np.cumsum(p / p.sum())


def synthetic_batch(seed: int, n: int, *, vocab: int = VOCAB, zipf_s: float = 0.7, median_terms: float = 150.0,
                    sigma_terms: float = 0.25, w_mu: float = -0.7, w_sigma: float = 1.0,
                    min_terms: int = 1, max_terms: int = 400) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` sparse vectors ``(term ids, float32 weights)``, deterministic in ``seed``.

    Term ranks are permuted by a fixed random map so that frequent terms are spread over the id
    space (as in a real vocabulary), drawn with replacement from Zipf(``zipf_s``) and de-duplicated.
    """
    rng = np.random.default_rng(seed)
    cdf = _zipf_cdf(vocab, zipf_s)
    perm = np.random.default_rng(12345).permutation(vocab)
    want = np.clip(np.rint(rng.lognormal(np.log(median_terms), sigma_terms, n)), min_terms, max_terms).astype(int)
    out = []
    for k in want:
        got = np.zeros(0, dtype=np.int64)
        draw = int(k * 1.5) + 8
        while len(got) < k:
            ranks = np.searchsorted(cdf, rng.random(draw))
            ranks = ranks[ranks < vocab]
            got = np.unique(np.concatenate([got, ranks]))
            draw *= 2
        sel = rng.permutation(got)[:k]
        ids = perm[sel]
        w = rng.lognormal(w_mu, w_sigma, len(ids)).astype(np.float32)
        out.append((ids, np.clip(w, 1e-3, 3.0)))
    return out


def token_names(vocab: int = VOCAB) -> list[str]:
    """Feature names of the synthetic vocabulary."""
    return [f"t{i}" for i in range(vocab)]


def doc_actions(start: int, vecs: list[tuple[np.ndarray, np.ndarray]], names: list[str]) -> list[dict]:
    """Bulk actions as the indexing job makes them: ``_id``, text, token->weight map."""
    acts = []
    for i, (ids, w) in enumerate(vecs):
        did = f"doc-{start + i:08d}"
        acts.append({"_id": did, "_source": {"text": f"passage {start + i}",
                                             FIELD: dict(zip([names[j] for j in ids.tolist()], w.tolist()))}})
    return acts


# ---- memory ------------------------------------------------------------------------------------------

def proc_status() -> dict[str, int]:
    """``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile`` of this process in bytes (Linux)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def du(path: Path) -> int:
    """Bytes of all files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ---- phases --------------------------------------------------------------------------------------------

def _state_path(index: Path, phase: str) -> Path:
    return index.with_name(index.name + f".{phase}.json")


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _save(path: Path, obj: dict) -> None:
    write_json(path, obj)


def build(args: argparse.Namespace) -> None:
    """Index ``--docs`` synthetic documents in ``--batch`` bulks; resumes where the last run stopped."""
    from opensearch_lsr.local.engine import LocalEngine

    index = Path(args.index)
    index.parent.mkdir(parents=True, exist_ok=True)
    state_file = _state_path(index, "build")
    state = _load(state_file)
    eng = LocalEngine(index.parent)
    if not state:
        eng.create_index(index.name, exist_ok=False)
        state = {"batch": args.batch, "done": 0, "bulk_s": 0.0, "gen_s": 0.0, "runs": [], "snapshots": {}}
    state["docs_target"] = args.docs
    state["rss_after_import"] = proc_status()["VmRSS"]  # interpreter + numpy/scipy + the package, no index
    info = run_info()
    state.setdefault("commands", []).append(f"{info['command']}  # {info['date']}, commit {info['commit']}")
    state["machine"] = info["machine"]
    names = token_names()
    t_start = time.perf_counter()
    run = {"start_done": state["done"], "peak_rss": 0, "peak_anon": 0}
    while state["done"] < state["docs_target"]:
        if time.perf_counter() - t_start > args.max_minutes * 60:
            break
        start = state["done"]
        n = min(state["batch"], state["docs_target"] - start)
        t0 = time.perf_counter()
        acts = doc_actions(start, synthetic_batch(args.seed * 1_000_003 + start // state["batch"], n), names)
        t1 = time.perf_counter()
        outcomes = eng.bulk(index.name, acts)  # LocalEngine.bulk -> LocalIndex.bulk, as lsr-os index does
        t2 = time.perf_counter()
        bad = [o for o in outcomes if not o.ok]
        if bad:
            raise SystemExit(f"bulk errors at {start}: {bad[:3]}")
        state["done"] = start + n
        state["gen_s"] += t1 - t0
        state["bulk_s"] += t2 - t1
        st = proc_status()
        run["peak_rss"] = max(run["peak_rss"], st["VmHWM"])
        run["peak_anon"] = max(run["peak_anon"], st["RssAnon"])
        if (state["done"] // n) % 20 == 0 or state["done"] == state["docs_target"]:
            _save(state_file, state)
            print(f"{state['done']:>9} docs  bulk {state['bulk_s']:.0f}s  rss {st['VmRSS'] / 2**20:.0f} MiB "
                  f"anon {st['RssAnon'] / 2**20:.0f} MiB  hwm {st['VmHWM'] / 2**20:.0f} MiB", flush=True)
    run["end_done"] = state["done"]
    run["peak_rss"] = max(run["peak_rss"], proc_status()["VmHWM"])
    state["runs"].append(run)
    if state["done"] >= state["docs_target"]:
        runs = state["runs"]
        state["snapshots"][str(state["done"])] = {
            "docs": state["done"], "bulk_s": state["bulk_s"], "gen_s": state["gen_s"],
            "peak_rss": max(r["peak_rss"] for r in runs), "peak_anon": max(r["peak_anon"] for r in runs),
            "disk": du(index), "segments": len(json.loads((index / "manifest.json").read_text())["segments"]),
            "commands": list(state["commands"])}
        state["commands"] = []
    _save(state_file, state)
    print("done" if state["done"] >= state["docs_target"] else f"stopped at {state['done']} (re-run to resume)")


def merge(args: argparse.Namespace) -> None:
    """Force-merge the index into one segment; time and peak memory."""
    from opensearch_lsr.local.index import LocalIndex

    index = Path(args.index)
    idx = LocalIndex.open(index)
    before = len(idx._manifest["segments"])
    took = time_call(idx.force_merge).best
    st = proc_status()
    info = run_info()
    out = {"docs": idx.count(), "segments_before": before, "merge_s": took, "peak_rss": st["VmHWM"], "peak_anon": st["RssAnon"],
           "disk": du(index), "command": f"{info['command']}  # {info['date']}, commit {info['commit']}"}
    _save(_state_path(index, "merge"), out)
    print(json.dumps(out))


def query(args: argparse.Namespace) -> None:
    """``--queries`` neural_sparse searches (size 10) after ``--warmup`` ones; p50/p95 and steady RSS."""
    from opensearch_lsr.local.index import LocalIndex

    index = Path(args.index)
    names = token_names()
    opened = time_call(lambda: LocalIndex.open(index))
    idx, open_s = opened.result, opened.best
    n = idx.count()
    rng = np.random.default_rng(args.seed + 7)
    nq = args.queries + args.warmup
    lens = rng.integers(10, 31, nq)
    qvecs = [synthetic_batch(args.seed + 100 + i, 1, median_terms=float(k), sigma_terms=0.0)[0]
             for i, k in enumerate(lens)]
    lat = []
    hits_total = []
    for i, (ids, w) in enumerate(qvecs):
        body = {"query": {"neural_sparse": {FIELD: {"query_tokens": dict(zip([names[j] for j in ids.tolist()],
                                                                              w.tolist()))}}}, "size": 10,
                "_source": False, "track_total_hits": True}
        timed = time_call(lambda: idx.search(body))
        if i >= args.warmup:
            lat.append(timed.best * 1000)
            hits_total.append(timed.result["hits"]["total"]["value"])
    st = proc_status()
    out = {"docs": n, "segments": len(idx._manifest["segments"]), "open_s": open_s, "queries": len(lat),
           "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
           "mean_ms": float(np.mean(lat)), "mean_matched": float(np.mean(hits_total)),
           "rss_query": st["VmRSS"], "anon_query": st["RssAnon"], "peak_rss_query": st["VmHWM"],
           "disk": du(index)}
    info = run_info()
    out["command"] = f"{info['command']}  # {info['date']}, commit {info['commit']}"
    out["tag"] = args.tag or str(n)
    _save(_state_path(index, f"query-{out['tag']}"), out)
    print(json.dumps(out))


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f}"


def report(args: argparse.Namespace) -> None:
    """The results table: one row per size snapshot of the index, ratios against the smallest."""
    index = Path(args.index)
    b = _load(_state_path(index, "build"))
    m = _load(_state_path(index, "merge"))
    queries = {q["tag"]: q for q in (_load(p) for p in index.parent.glob(index.name + ".query-*.json"))}
    snaps = sorted(b.get("snapshots", {}).values(), key=lambda x: x["docs"])
    base = next((queries[str(sn["docs"])] for sn in snaps if str(sn["docs"]) in queries), None)
    base_snap = snaps[0] if snaps else None
    body = []
    for sn in snaps:
        q = queries.get(str(sn["docs"]))
        row = [f"{sn['docs']:,}", f"{sn['bulk_s']:.0f} s", f"{sn['docs'] / max(sn['bulk_s'], 1e-9):,.0f}",
               f"{_gib(sn['peak_rss'])} GiB ({_gib(sn['peak_anon'])})", f"{_gib(sn['disk'])} GiB", sn["segments"]]
        if q:
            ratio = (f"{q['p50_ms'] / base['p50_ms']:.1f}x / {q['anon_query'] / base['anon_query']:.1f}x"
                     if base else "-")
            row += [f"{_gib(q['rss_query'])} GiB ({_gib(q['anon_query'])})", f"{q['p50_ms']:.1f}", f"{q['p95_ms']:.1f}",
                    f"{q['mean_matched']:,.0f}", ratio]
        else:
            row += ["-"] * 5
        body.append(row)
    machine = describe(b["machine"]) if b.get("machine") else "not recorded"
    lines = [f"Machine (build): {machine}. The commands below carry their dates and commits.",
             f"Resident memory of the build process before indexing anything (imports): "
             f"{_gib(b.get('rss_after_import', 0))} GiB", "",
             markdown_table(["docs", "index time (bulk only)", "docs/s", "peak RSS indexing (anon)", "disk", "segments",
                             "RSS querying (anon)", "p50 ms", "p95 ms", "mean matched docs",
                             "p50 / RSS-anon ratio vs first row"], body).rstrip("\n")]
    if m:
        q = queries.get("merged")
        lines += ["", f"Force-merge at {m['docs']:,} docs: {m['segments_before']} segments -> 1 in {m['merge_s']:.0f} s, "
                  f"peak RSS {_gib(m['peak_rss'])} GiB; disk after {_gib(m['disk'])} GiB."
                  + (f" Queries on the merged index: p50 {q['p50_ms']:.1f} ms, p95 {q['p95_ms']:.1f} ms, "
                     f"RSS {_gib(q['rss_query'])} GiB (anon {_gib(q['anon_query'])})." if q else "")]
    lines += ["", "Commands (in order):", ""]
    for sn in snaps:
        lines += [f"- `{c}`" for c in sn.get("commands", [])]
        q = queries.get(str(sn["docs"]))
        if q:
            lines.append(f"- `{q['command']}`")
    if m:
        lines.append(f"- `{m['command']}`")
        if "merged" in queries:
            lines.append(f"- `{queries['merged']['command']}`")
    if base_snap is None:
        lines.append("(no size reached yet)")
    text = "\n".join(lines) + "\n"
    if args.out:
        out = Path(args.out)
        head = out.read_text().split("<!-- table -->")[0] if out.exists() else ""
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(head + "<!-- table -->\n" + text)
    print(text)


def vector_stats(vecs: list[tuple[np.ndarray, np.ndarray]], vocab: int) -> dict:
    """Active terms per doc, document frequency of the most frequent terms, weight quantiles."""
    nnz = np.array([len(i) for i, _ in vecs])
    df = np.bincount(np.concatenate([i for i, _ in vecs]), minlength=vocab) / len(vecs)
    dfs = np.sort(df)[::-1]
    w = np.concatenate([x for _, x in vecs])
    return {"docs": len(vecs), "nnz_p10_p50_p90": np.percentile(nnz, [10, 50, 90]).round(1).tolist(),
            "df_rank1_10_100_1000": [round(float(dfs[r]), 4) for r in (0, 9, 99, 999)],
            "terms_with_df>0": int((df > 0).sum()),
            "postings_in_top100_terms": round(float(dfs[:100].sum() / dfs.sum()), 3),
            "weight_p10_p50_p90_max": np.percentile(w, [10, 50, 90, 100]).round(3).tolist()}


def stats(args: argparse.Namespace) -> None:
    """Statistics of real SPLADE-tiny document vectors (MS MARCO passages) next to the synthetic ones."""
    from opensearch_lsr.resources import splade_tiny_path
    from sentence_transformers import SparseEncoder

    set_threads(1)
    texts = []
    with open(Path(args.data) / "corpus.jsonl") as fh:
        for line in fh:
            texts.append(json.loads(line)["text"])
            if len(texts) >= args.passages:
                break
    model = SparseEncoder(str(splade_tiny_path()), device="cpu")
    emb = model.encode_document(texts, batch_size=32, convert_to_sparse_tensor=True).coalesce().cpu()
    idx, val = emb.indices().numpy(), emb.values().numpy()
    real = []
    for r in range(len(texts)):
        sel = idx[0] == r
        real.append((idx[1][sel], val[sel]))
    out = {"splade_tiny_msmarco": vector_stats(real, VOCAB),
           "synthetic": vector_stats(synthetic_batch(1, args.passages), VOCAB)}
    if args.out:
        write_json(args.out, {**out, "run": run_info()})
    print(json.dumps(out, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="phase", required=True)
    b = sub.add_parser("build")
    b.add_argument("--docs", type=int, required=True)
    b.add_argument("--index", required=True)
    b.add_argument("--batch", type=int, default=2000)
    b.add_argument("--max-minutes", type=float, default=14.0)
    b.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("merge")
    m.add_argument("--index", required=True)
    q = sub.add_parser("query")
    q.add_argument("--index", required=True)
    q.add_argument("--queries", type=int, default=300)
    q.add_argument("--warmup", type=int, default=20)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--tag", default="", help="name of the result (default: the document count; e.g. merged)")
    r = sub.add_parser("report")
    r.add_argument("--index", required=True)
    r.add_argument("--out", default=None)
    s = sub.add_parser("stats")
    s.add_argument("--passages", type=int, default=2000)
    s.add_argument("--data", default="/work/shared/data/msmarco-en")
    s.add_argument("--out", default=None)
    args = ap.parse_args()
    {"build": build, "merge": merge, "query": query, "report": report, "stats": stats}[args.phase](args)


if __name__ == "__main__":
    main()
