"""What every benchmark script shares: the data, the clock, the machine, the results files.

A script runs as ``python benchmarks/<name>.py ...`` (this folder is then first on ``sys.path``) and uses:

``set_threads(n)``
    torch's intra-op threads for the timed work (the machine is usually shared: say how many).
``load_dataset(path=None, split="dev", max_queries=None, max_docs=None)``
    a BEIR-layout dataset (default: MS MARCO-ko of the shared data), queries and corpus capped the way
    ``lsr-os eval`` caps them (judged documents kept); ``corpus_texts(dataset)`` gives ``(ids, texts)``.
``time_call(fn, repeats=1, warmup=0)`` -> :class:`Timing`
    wall (and process CPU) seconds of each run, their median and best, and the last run's result.
``Stages``
    named stages (``with stages("encode"): ...`` or ``stages.call("encode", fn)``) adding up wall seconds
    (``stages.seconds``) and process CPU seconds (``stages.cpu``).
``machine()`` / ``describe(machine)``
    CPU model, cores, RAM, instruction-set flags, GPU, OS, Python and torch versions, load average.
``run_info(argv=None)``
    ``{"date", "commit", "command", "machine"}`` of this run: what every results file states;
    ``recorded_in(path)`` names the commits that wrote an older results file (for figures without a stamp).
``write_results(stem, payload, markdown=None)``
    ``<stem>.json`` (``payload`` plus ``"run": run_info()``) and, with ``markdown``, ``<stem>.md`` opened by a
    line giving the date, commit, command and machine (``write_markdown(path, text)`` writes such a file alone,
    ``write_json(path, obj)`` a JSON file); ``markdown_table(header, rows)`` renders a table.

Ratios are always taken against a baseline measured in the same run; the harness only records the figures.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the package of this checkout, also when it is not installed
    sys.path.insert(1, str(ROOT))

__all__ = ["ROOT", "set_threads", "load_dataset", "corpus_texts", "Timing", "time_call", "Stages", "machine",
           "describe", "git_commit", "recorded_in", "run_info", "write_json", "write_markdown", "write_results", "markdown_table"]


def set_threads(threads: int) -> int:
    """Use ``threads`` torch intra-op threads (and as many for OpenMP libraries started later)."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(int(threads))
    return int(threads)


def load_dataset(path: str | os.PathLike | None = None, split: str = "dev", max_queries: int | None = None,
                 max_docs: int | None = None):
    """A BEIR dataset (``opensearch_lsr.evaluation.datasets.BeirDataset``); default MS MARCO-ko of the shared
    data. ``max_queries`` keeps the first judged queries, ``max_docs`` caps the corpus keeping judged documents."""
    from opensearch_lsr.evaluation.datasets import cap_corpus, load_beir
    from opensearch_lsr.resources import shared_data_dir

    data = load_beir(path if path is not None else shared_data_dir() / "msmarco-ko", split)
    if max_queries is not None:
        data = data.subset(max_queries)
    return cap_corpus(data, max_docs) if max_docs is not None else data


def corpus_texts(dataset) -> tuple[list[str], list[str]]:
    """``(document ids, texts)`` of a dataset's corpus, in its order."""
    ids = list(dataset.corpus)
    return ids, [dataset.corpus[i] for i in ids]


@dataclass
class Timing:
    """Wall seconds of each timed run (``runs``), their process CPU seconds (``cpu_runs``) and the result of
    the last one."""

    runs: list[float]
    result: Any = None
    cpu_runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def best(self) -> float:
        return min(self.runs)

    def as_dict(self) -> dict[str, Any]:
        return {"runs_s": [round(r, 4) for r in self.runs], "median_s": round(self.median, 4),
                "best_s": round(self.best, 4)}


def time_call(fn: Callable[[], Any], repeats: int = 1, warmup: int = 0) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed (``time.perf_counter``)."""
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    for _ in range(warmup):
        fn()
    runs, cpu, result = [], [], None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        runs.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return Timing(runs, result, cpu)


@dataclass
class Stages:
    """Named stages: ``with stages("encode"): ...``; ``stages.seconds`` maps name -> wall seconds and
    ``stages.cpu`` name -> process CPU seconds (a stage entered twice adds up)."""

    seconds: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - start_cpu

    def call(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` timed as stage ``name``; returns its result."""
        with self(name):
            return fn()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags(wanted: Sequence[str] = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")) -> list[str]:
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("flags")), [])
    except OSError:
        flags = []
    return [f for f in wanted if f in flags]


def _ram_gib() -> float | None:
    try:
        kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal"))
        return round(kb / 2**20, 1)
    except (OSError, StopIteration):
        return None


def machine() -> dict[str, Any]:
    """What ran the figures: CPU, cores, RAM, flags, GPU, OS, Python, torch, load average now."""
    try:
        import torch

        torch_version = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover - every benchmark environment has torch
        torch_version, gpu = None, None
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "ram_gib": _ram_gib(), "cpu_flags": _cpu_flags(),
            "gpu": gpu, "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch_version, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def describe(m: dict[str, Any] | None = None) -> str:
    """One line for a results file: ``2 cores (AMD EPYC ...), 23.5 GiB RAM, no GPU, Linux ..., load 1.2``."""
    m = m or machine()
    flags = f"; {', '.join(m['cpu_flags'])}" if m.get("cpu_flags") else ""
    return (f"{m['cores']} cores ({m['cpu']}{flags}), {m['ram_gib']} GiB RAM, {m['gpu'] or 'no GPU'}, {m['os']}, "
            f"Python {m['python']}, torch {m['torch']}, load average {m['loadavg'][0]:.2f} at the start")


def git_commit(root: Path = ROOT) -> str:
    """``HEAD``'s short hash (``+dirty`` when tracked files differ), or ``unknown`` outside a checkout;
    ``LSR_COMMIT`` wins (a copy of the tree on another machine may carry a stale ``.git``)."""
    if os.environ.get("LSR_COMMIT"):
        return os.environ["LSR_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"], capture_output=True)
        return head + ("+dirty" if dirty.returncode else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def recorded_in(path: str | os.PathLike, root: Path = ROOT) -> str:
    """``commits <oldest> (<date> UTC) to <newest> (<date> UTC)`` that wrote ``path`` (``git log``), or one commit."""
    try:
        log = subprocess.run(["git", "-C", str(root), "log", "--format=%h (%ad UTC)", "--date=format:%Y-%m-%d %H:%M",
                              "--", str(Path(path).resolve())], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        log = []
    if not log:
        return "an unknown commit (no git history)"
    return f"commit {log[0]}" if len(log) == 1 else f"commits {log[-1]} to {log[0]}"


def run_info(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The date (UTC), commit, command line and machine of this run."""
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(".py"):
        try:
            argv[0] = str(Path(argv[0]).resolve().relative_to(ROOT))
        except ValueError:
            pass
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git_commit(),
            "command": "python " + shlex.join(argv), "machine": machine()}


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Write ``payload`` as indented JSON (non-ASCII kept; unknown objects via ``str``), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def write_markdown(path: str | os.PathLike, markdown: str, info: dict[str, Any] | None = None) -> Path:
    """Write ``markdown`` opened by a run line (date, commit, command, machine: :func:`run_info`, or ``info``);
    a leading ``# title`` stays first."""
    info = info or run_info()
    header = (f"Run: {info['date']}, commit `{info['commit']}`, `{info['command']}`; "
              f"machine: {describe(info['machine'])}.\n\n")
    lines = markdown.splitlines(keepends=True)
    if lines and lines[0].startswith("# "):
        text = lines[0] + "\n" + header + "".join(lines[1:]).lstrip("\n")
    else:
        text = header + markdown
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    return path


def write_results(stem: str | os.PathLike, payload: dict[str, Any], markdown: str | None = None,
                  info: dict[str, Any] | None = None) -> tuple[Path, Path | None]:
    """``<stem>.json`` = ``payload`` + ``"run"`` (:func:`run_info`, or ``info``); with ``markdown``,
    ``<stem>.md`` (:func:`write_markdown`)."""
    info = info or run_info()
    stem = Path(stem)
    json_path = write_json(stem.with_suffix(".json"), {**payload, "run": info})
    md_path = write_markdown(stem.with_suffix(".md"), markdown, info) if markdown is not None else None
    return json_path, md_path


def publish(result: dict[str, Any], markdown: str, out: str | os.PathLike | None) -> dict[str, Any]:
    """Print ``markdown``; with ``out``, write ``result`` there as JSON and the table beside it as ``.md``
    (:func:`write_results`). Returns ``result``."""
    print(markdown)
    if out:
        write_results(Path(out).with_suffix(""), result, markdown)
    return result


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], floats: str = ".3f") -> str:
    """A markdown table; floats formatted with ``floats``, ``None`` as an em dash."""
    def cell(value: Any) -> str:
        if value is None:
            return "—"
        if isinstance(value, float):
            return format(value, floats)
        return str(value).replace("|", "/")

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out) + "\n"
