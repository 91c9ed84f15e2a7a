"""``lsr-os index --engine ray`` against the single-process job: documents per second with 1 and 2 workers.

Every run writes NDJSON (no cluster in this environment) from the same first ``--limit`` passages; the
single-process job is measured in the same run as the baseline, and every Ray output is checked to be
the same documents (ids, texts, weights) with the same counts. Wall times are end to end (model loads
and, for Ray, actor start-up included); the Ray cluster itself is started once, before the runs, and
its start-up is reported apart.

    flock /tmp/lsr-heavy.lock nice -n 5 python benchmarks/ray_index.py --limit 2000 \\
        --md benchmarks/results/scale/ray.md --json runs/ray_bench/result.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
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

    def on_ray(workers: int) -> dict:
        out = work / f"ray_w{workers}"
        stamps: list[float] = []
        t0 = time.perf_counter()
        timed = time_call(lambda: run_ray_index_job(IndexJobConfig(index=str(out), threads=1, **common),
                                                    RayOptions(workers=workers, cpus_per_worker=1), progress=False,
                                                    on_block=lambda block: stamps.append(time.perf_counter())))
        summary, wall = timed.result, timed.best
        ledger = [json.loads(x) for x in (Path(summary["work_dir"]) / "ray_blocks.jsonl").read_text().splitlines()]
        # after start-up: from the first completed block to the last (the first block's documents excluded)
        steady = ((summary["indexed"] - ledger[0]["counters"]["indexed"]) / (stamps[-1] - stamps[0])
                  if len(stamps) > 1 else None)
        return {"engine": "ray", "workers": workers, "threads": 1, "wall_s": wall, "summary": summary, "out": out,
                "steady_docs_per_s": round(steady, 2) if steady else None,
                "startup_s": round(stamps[0] - t0, 2) if stamps else None}

    stages = Stages()
    with stages("ray_init"):
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}})
    result["ray_init_s"] = round(stages.seconds["ray_init"], 2)
    runs = [single(1)]
    runs += [on_ray(int(w)) for w in args.workers.split(",")]
    runs.append(single(os.cpu_count() or 1))
    ray.shutdown()

    ref_docs, ref_n = read_ndjson_documents(runs[0]["out"])
    base = runs[0]
    for run in runs:
        docs, n = read_ndjson_documents(run["out"])
        s = run["summary"]
        run["identical_documents"] = docs == ref_docs and n == ref_n
        run["same_counts"] = {k: s[k] for k in COUNTS} == {k: base["summary"][k] for k in COUNTS}
        run["docs"] = s["indexed"]
        run["docs_per_s"] = round(s["indexed"] / run["wall_s"], 2)
        run["vs_single_1_thread"] = round(base["wall_s"] / run["wall_s"], 3)
        run["wall_s"] = round(run["wall_s"], 2)
        run["out"] = str(run["out"])
        run["summary"] = {k: s[k] for k in (*COUNTS, "this_run")} | ({"blocks": s["blocks"]} if "blocks" in s else {})
    ray_runs = {r["workers"]: r for r in runs if r["engine"] == "ray"}
    if 1 in ray_runs and 2 in ray_runs:
        result["ray_2_over_1"] = round(ray_runs[1]["wall_s"] / ray_runs[2]["wall_s"], 3)
    result["runs"] = runs
    if not args.no_tests:
        result["tests"] = _run_tests()
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        write_json(args.json, result)
    if args.md:
        write_markdown(args.md, render(result), result["run"])
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1, default=str))
    for run in runs:
        print(json.dumps({k: run[k] for k in ("engine", "workers", "threads", "wall_s", "docs_per_s", "steady_docs_per_s",
                                              "vs_single_1_thread", "identical_documents", "same_counts")
                          if k in run}))
    return result


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
    rows = []
    for run in r["runs"]:
        what = (f"single process, {run['threads']} torch thread(s)" if run["engine"] == "single"
                else f"`--engine ray --workers {run['workers']}` (1 CPU / 1 thread per actor)")
        rows.append(f"| {what} | {run['docs']} | {run['wall_s']} | **{run['docs_per_s']}** | "
                    f"{run['vs_single_1_thread']} | {run.get('steady_docs_per_s')} | {run.get('startup_s', '-')} | "
                    f"{'yes' if run['identical_documents'] else 'NO'} | "
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
        "start-up s (to the first block written) | same documents (ids, text, weights) | same counts |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if "ray_2_over_1" in r:
        lines.append(f"**Ray, 2 workers over 1 worker: {r['ray_2_over_1']}x** (wall time ratio, same run).")
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
