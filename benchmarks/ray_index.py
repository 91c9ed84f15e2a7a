"""``lsr-os index --engine ray`` against the single-process job: documents per second with 1 and 2 workers.

Every run writes NDJSON (no cluster in this environment) from the same first ``--limit`` passages; the
single-process job is measured in the same run as the baseline, and every Ray output is checked to be
the same documents (ids, texts, active keys; weights identical, or else the largest difference) with the
same counts. Wall times are end to end (model loads
and, for Ray, actor start-up included); the Ray cluster itself is started once, before the runs, and
its start-up is reported apart. ``--calls 1,2`` compares blocks taken at once per actor
(``RayOptions.calls_per_worker``) at each worker count; ``--repeat N`` runs every Ray setting N times in
rotating order and reports medians.

    flock /tmp/lsr-heavy.lock nice -n 5 python benchmarks/ray_index.py --limit 2000 \\
        --md benchmarks/results/scale/ray.md --json runs/ray_bench/result.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, Stages, run_info, set_threads, time_call, write_json, write_markdown

__all__ = ["main"]

KO_MODEL = ROOT / "runs" / "models" / "ko-sembridge"

COUNTS = ("indexed", "dead_lettered", "skipped", "truncated", "generated_ids", "utf8_replaced")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(KO_MODEL) if KO_MODEL.is_dir() else "splade-tiny")
    ap.add_argument("--corpus", default="/work/shared/data/msmarco-ko/corpus.jsonl")
    ap.add_argument("--limit", type=int, default=2000, help="first N corpus lines")
    ap.add_argument("--chunk-docs", type=int, default=128, help="records per block / checkpoint")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--calls", default=None,
                    help="blocks per actor at once to compare, e.g. 1,2 [default: RayOptions' default]")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each Ray setting (rotating order; medians)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "ray_bench"))
    ap.add_argument("--md", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-tests", action="store_true",
                    help="skip running tests/encoding/test_ray_job.py (slow ones included) after the runs")
    args = ap.parse_args(argv)

    import ray

    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job
    from opensearch_lsr.encoding.ray_job import RayOptions, run_ray_index_job
    from opensearch_lsr.encoding.writers import read_ndjson_documents

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus = work / "corpus.jsonl"
    with open(args.corpus, "rb") as src, open(corpus, "wb") as dst:
        for i, line in enumerate(src):
            if i >= args.limit:
                break
            dst.write(line)
    common = {"corpus": str(corpus), "model": args.model, "backend": "ndjson", "chunk_docs": args.chunk_docs,
              "batch_size": args.batch_size}
    result = {"run": run_info(), "model": args.model, "corpus": args.corpus, "limit": args.limit,
              "chunk_docs": args.chunk_docs, "batch_size": args.batch_size, "runs": []}
    weights = Path(args.model) / "model.safetensors"
    if weights.exists():
        result["model_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]

    def single(threads: int) -> dict:
        set_threads(threads)
        out = work / f"single_t{threads}"
        timed = time_call(lambda: run_index_job(IndexJobConfig(index=str(out), threads=threads, **common),
                                                progress=False))
        summary = timed.result
        return {"engine": "single", "threads": threads, "wall_s": timed.best, "summary": summary,
                "out": out, "steady_docs_per_s": summary["this_run"]["docs_per_s"]}

    def on_ray(workers: int, calls: int, repeat: int) -> dict:
        out = work / f"ray_w{workers}_c{calls}_r{repeat}"
        stamps: list[float] = []
        t0 = time.perf_counter()
        options = RayOptions(workers=workers, cpus_per_worker=1, calls_per_worker=calls)
        timed = time_call(lambda: run_ray_index_job(IndexJobConfig(index=str(out), threads=1, **common),
                                                    options, progress=False,
                                                    on_block=lambda block: stamps.append(time.perf_counter())))
        summary, wall = timed.result, timed.best
        ledger = [json.loads(x) for x in (Path(summary["work_dir"]) / "ray_blocks.jsonl").read_text().splitlines()]
        # after start-up: from the first completed block to the last (the first block's documents excluded)
        steady = ((summary["indexed"] - ledger[0]["counters"]["indexed"]) / (stamps[-1] - stamps[0])
                  if len(stamps) > 1 else None)
        return {"engine": "ray", "workers": workers, "calls": calls, "threads": 1, "wall_s": wall, "summary": summary,
                "out": out,
                "steady_docs_per_s": round(steady, 2) if steady else None,
                "startup_s": round(stamps[0] - t0, 2) if stamps else None}

    stages = Stages()
    with stages("ray_init"):
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}})
    result["ray_init_s"] = round(stages.seconds["ray_init"], 2)
    calls = [int(c) for c in args.calls.split(",")] if args.calls else [RayOptions().calls_per_worker]
    settings = [(int(w), c) for w in args.workers.split(",") for c in calls]
    runs = [single(1)]
    for repeat in range(args.repeat):  # each round starts one setting later, so load drifts hit all alike
        k = repeat % len(settings)
        runs += [on_ray(w, c, repeat) for w, c in settings[k:] + settings[:k]]
    runs.append(single(os.cpu_count() or 1))
    ray.shutdown()

    ref_docs, ref_n = read_ndjson_documents(runs[0]["out"])
    base = runs[0]
    for run in runs:
        docs, n = read_ndjson_documents(run["out"])
        s = run["summary"]
        run["identical_documents"] = docs == ref_docs and n == ref_n
        run["max_abs_dw"] = _weight_distance(ref_docs, docs) if n == ref_n else None
        run["same_counts"] = {k: s[k] for k in COUNTS} == {k: base["summary"][k] for k in COUNTS}
        run["docs"] = s["indexed"]
        run["docs_per_s"] = round(s["indexed"] / run["wall_s"], 2)
        run["vs_single_1_thread"] = round(base["wall_s"] / run["wall_s"], 3)
        run["wall_s"] = round(run["wall_s"], 2)
        run["out"] = str(run["out"])
        run["summary"] = {k: s[k] for k in (*COUNTS, "this_run")} | ({"blocks": s["blocks"]} if "blocks" in s else {})
    result["runs"] = runs
    result["ray_settings"] = settings_rows = _medians([r for r in runs if r["engine"] == "ray"], base["wall_s"])
    by = {(r["workers"], r["calls"]): r for r in settings_rows}
    default = RayOptions().calls_per_worker
    if (1, default) in by and (2, default) in by:
        result["ray_2_over_1"] = round(by[(1, default)]["wall_s"] / by[(2, default)]["wall_s"], 3)
    if len(calls) > 1:  # each setting against one block at a time, same worker count (ratio of median walls)
        result["calls_over_1"] = {f"workers {w}, calls {c}": round(by[(w, 1)]["wall_s"] / by[(w, c)]["wall_s"], 3)
                                  for w, c in settings if c != 1 and (w, 1) in by}
    if not args.no_tests:
        result["tests"] = _run_tests()
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        write_json(args.json, result)
    if args.md:
        write_markdown(args.md, render(result), result["run"])
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1, default=str))
    for run in runs:
        print(json.dumps({k: run[k] for k in ("engine", "workers", "calls", "threads", "wall_s", "docs_per_s",
                                              "steady_docs_per_s", "vs_single_1_thread", "identical_documents",
                                              "max_abs_dw", "same_counts")
                          if k in run}))
    return result


def _medians(ray_runs: list[dict], single_wall: float) -> list[dict]:
    """One row per (workers, calls) setting: median wall time, docs/s and steady docs/s over its repeats, every
    run's docs/s, and whether every repeat wrote the baseline's documents and counts."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for run in ray_runs:
        groups.setdefault((run["workers"], run["calls"]), []).append(run)
    rows = []
    for (workers, calls), group in sorted(groups.items()):
        wall = statistics.median(r["wall_s"] for r in group)
        steady = [r["steady_docs_per_s"] for r in group if r["steady_docs_per_s"]]
        rows.append({"workers": workers, "calls": calls, "repeats": len(group), "docs": group[0]["docs"],
                     "wall_s": round(wall, 2),
                     "docs_per_s": round(statistics.median(r["docs_per_s"] for r in group), 2),
                     "docs_per_s_runs": [r["docs_per_s"] for r in group],
                     "steady_docs_per_s": round(statistics.median(steady), 2) if steady else None,
                     "startup_s": statistics.median(r["startup_s"] for r in group if r["startup_s"] is not None)
                     if any(r["startup_s"] is not None for r in group) else None,
                     "vs_single_1_thread": round(single_wall / wall, 3),
                     "identical_documents": all(r["identical_documents"] for r in group),
                     "max_abs_dw": None if any(r["max_abs_dw"] is None for r in group)
                     else max(r["max_abs_dw"] for r in group),
                     "same_counts": all(r["same_counts"] for r in group)})
    return rows


def _weight_distance(ref: dict[str, dict], docs: dict[str, dict]) -> float | None:
    """Largest weight difference to the baseline's documents, or None when ids, texts or the active keys differ
    (then they are not the same documents at all). Packed batches cut from other windows (Ray's blocks against
    the single process's windows) round differently in the last bits, within the fp32 budget of 1e-5."""
    worst = 0.0
    for doc_id, want in ref.items():
        got = docs.get(doc_id)
        if got is None or got.get("text") != want.get("text"):
            return None
        a, b = want["sparse_embedding"], got["sparse_embedding"]
        if a.keys() != b.keys():
            return None
        worst = max(worst, max((abs(a[k] - b[k]) for k in a), default=0.0))
    return worst


def _sameness(run: dict) -> str:
    if run["identical_documents"]:
        return "yes, identical"
    if run.get("max_abs_dw") is not None:
        return f"yes, weights within {run['max_abs_dw']:.1e}"
    return "NO"


def _run_tests() -> dict:
    """The guarantees behind the figures: the Ray test file, slow tests included, in a subprocess."""
    cmd = [sys.executable, "-m", "pytest", "-q", "tests/encoding/test_ray_job.py", "-m", "slow or not slow",
           "-p", "no:logging", "-rA"]
    timed = time_call(lambda: subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                             env={**os.environ, "OMP_NUM_THREADS": "1",
                                                  "TOKENIZERS_PARALLELISM": "false"}))
    proc = timed.result
    lines = proc.stdout.splitlines()
    return {"command": " ".join(["python", *cmd[1:]]), "returncode": proc.returncode,
            "wall_s": round(timed.best, 1),
            "results": [l for l in lines if l.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED"))],
            "last_line": lines[-1] if lines else proc.stderr[-500:]}


def render(r: dict) -> str:
    """The results file (after the run line: date, commit, command, machine): one row per run."""
    singles = [(f"single process, {run['threads']} torch thread(s)", run) for run in r["runs"]
               if run["engine"] == "single"]
    settings = []
    for row in r["ray_settings"]:
        what = (f"`--engine ray --workers {row['workers']}` (1 CPU / 1 thread per actor, "
                f"{row['calls']} block(s) at once)")
        if row["repeats"] > 1:
            what += f", median of {row['repeats']}: {' / '.join(str(x) for x in row['docs_per_s_runs'])} docs/s"
        settings.append((what, row))
    rows = []
    for what, run in [singles[0], *settings, *singles[1:]]:
        rows.append(f"| {what} | {run['docs']} | {run['wall_s']} | **{run['docs_per_s']}** | "
                    f"{run['vs_single_1_thread']} | {run.get('steady_docs_per_s')} | {run.get('startup_s', '-')} | "
                    f"{_sameness(run)} | "
                    f"{'yes' if run['same_counts'] else 'NO'} |")
    lines = [
        "# `lsr-os index --engine ray`: documents per second, 1 and 2 workers, against the single-process job",
        "",
        f"- Load average {', '.join(f'{x:.1f}' for x in r['run']['machine']['loadavg'])} at the start, "
        f"{', '.join(f'{x:.1f}' for x in r['load_avg_end'])} at the end (the cores may be shared with other jobs).",
        (f"- GPU: {r['run']['machine']['gpu']}." if r["run"]["machine"].get("gpu") else
         "- **No GPU on this machine**: `--num-gpus-per-worker` is implemented (the actor encodes on its "
         "GPU, bf16 autocast with `--precision auto`) but not measured here."),
        f"- Model: `{r['model']}`" + (f" (model.safetensors sha256 {r['model_sha256']}…)" if r.get("model_sha256") else "")
        + f"; corpus: the first {r['limit']:,} lines of `{r['corpus']}`; `--chunk-docs {r['chunk_docs']}` "
        f"(one Ray block each), `--batch-size {r['batch_size']}`, backend NDJSON.",
        f"- Ray 2.60.0 local cluster started once before the runs (`ray.init`, {r['ray_init_s']} s, not in the "
        "times below). Wall times are end to end: model load, the driver's plan pass over the corpus, actor "
        "start-up (each actor imports torch and loads the model once), encoding and writing. \"After start-up\": "
        "single process = the job's own `this_run.docs_per_s` (after the model load); Ray = documents of blocks 2..n "
        "over the time from the first completed block to the last.",
        "",
        "| run | docs | wall s | docs/s (end to end) | x vs single 1 thread (wall) | docs/s after start-up | "
        "start-up s (to the first block written) | same documents (ids, text, active keys; weights) | same counts |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if "ray_2_over_1" in r:
        lines.append(f"**Ray, 2 workers over 1 worker: {r['ray_2_over_1']}x** (wall time ratio, same run).")
        lines.append("")
    for what, ratio in (r.get("calls_over_1") or {}).items():
        lines.append(f"**Ray, {what} over one block at a time: {ratio}x** (ratio of median wall times, same run).")
        lines.append("")
    if "tests" in r:
        t = r["tests"]
        lines += ["## The guarantees (tests, run right after the figures, same machine)", "",
                  f"`{t['command']}`: **{t['last_line'].strip('= ')}** (exit {t['returncode']}, {t['wall_s']} s wall).", ""]
        lines += [f"- {x}" for x in t["results"]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
