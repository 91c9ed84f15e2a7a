"""The GPU encoder's targets, judged from one ``gpu_encode.py`` result: each target, what the run measured, met or
not. The thresholds are for one H100 / H200 with the default half-precision encode (fp16 on CUDA since
``precision.resolve_precision`` chose it; bf16 before); where a row cannot apply (a CPU run, a section left out, an
fp32 default) it says why instead of a verdict, so a CPU run in CI renders the same table. bf16's distance to fp32
keeps a row of its own (the explicit bf16 encode where the default is fp16), and so does its share of the peak.

Used by ``gpu_encode.py`` (its markdown opens with this table and its JSON carries ``targets``); by hand::

    python benchmarks/gpu_targets.py RESULT.json
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: the default (half-precision) encode of the BERT-base-shaped model, % of the run's measured bf16 peak (fp16 has
#: the same tensor-core rate)
PEAK_SHARE_PCT = 40.0
#: packed over the padded reference, same card and run
SPEEDUP_OVER_REFERENCE = 6.0
GPU_BUSY_SHARE = 0.90
HOST_SYNCS_PER_BATCH = 1.0
PEAK_GPU_GB_AT_32K = 24.0
SPLADE_TINY_DOCS_PER_S = 15_000.0
#: ``lsr-os index --backend ndjson`` docs/s over encode-only docs/s
JOB_SHARE_OF_ENCODE = 0.70
FP32_MAX_ABS_DW = 1e-5
#: a half precision (bf16 or fp16) against fp32
HALF_MAX_ABS_DW = 0.10
HALF_JACCARD = 0.99
HALF_MRR_DELTA = 0.002
HALF = ("bf16", "fp16")


@dataclass(frozen=True)
class Verdict:
    """One target on one model: ``met`` is None where the run cannot judge it, and ``measured`` then says why."""
    target: str
    model: str
    measured: str
    met: bool | None


def _get(row: dict, *path: str) -> Any:
    for key in path:
        row = row.get(key) if isinstance(row, dict) else None
    return row


NOT_MEASURED = ("not measured in this run", None)


def _pct(share: float) -> str:
    return f"{100 * share:.1f} %"


def _peak_share(r: dict) -> tuple[str, bool | None]:
    pct = _get(r, "packed", "pct_of_peak")
    if pct is None:
        return NOT_MEASURED
    other = r.get("packed_bf16") if _get(r, "packed", "precision") != "bf16" else None
    also = f"; bf16 {other['pct_of_peak']} % ({other['docs_per_s']:,} docs/s)" if other else ""
    return f"{_get(r, 'packed', 'precision')} {pct} % ({_get(r, 'packed', 'docs_per_s'):,} docs/s){also}", \
        pct >= PEAK_SHARE_PCT


def _speedup(r: dict) -> tuple[str, bool | None]:
    x, old, new = r.get("speedup_packed_over_reference"), _get(r, "reference", "docs_per_s"), _get(r, "packed",
                                                                                                   "docs_per_s")
    if x is None or old is None or new is None:
        return NOT_MEASURED
    return f"{x}x ({old:,} -> {new:,} docs/s)", x >= SPEEDUP_OVER_REFERENCE


def _busy(r: dict) -> tuple[str, bool | None]:
    share, gaps = r.get("gpu_busy_share"), _get(r, "gpu_profile", "gaps_over_1ms")
    if share is None:
        return NOT_MEASURED
    detail = f" ({gaps} gaps over 1 ms, the longest {_get(r, 'gpu_profile', 'largest_gap_ms'):.1f} ms)" \
        if gaps is not None else ""
    return _pct(share) + detail, share >= GPU_BUSY_SHARE


def _syncs(r: dict) -> tuple[str, bool | None]:
    syncs = r.get("host_syncs_per_batch")
    return NOT_MEASURED if syncs is None else (f"{syncs}", syncs <= HOST_SYNCS_PER_BATCH)


def _padding(r: dict) -> tuple[str, bool | None]:
    share = _get(r, "packed", "padded_share")
    return NOT_MEASURED if share is None else (_pct(share), share == 0.0)


def _memory(r: dict) -> tuple[str, bool | None]:
    gb = _get(r, "token_budgets", "32768", "peak_gpu_gb")
    return NOT_MEASURED if gb is None else (f"{gb} GB", gb <= PEAK_GPU_GB_AT_32K)


def _splade_rate(r: dict) -> tuple[str, bool | None]:
    rate = _get(r, "packed", "docs_per_s")
    return NOT_MEASURED if rate is None else (f"{rate:,} docs/s", rate >= SPLADE_TINY_DOCS_PER_S)


def _half_over_fp32(r: dict) -> tuple[str, bool | None]:
    low, full = _get(r, "packed", "docs_per_s"), _get(r, "packed_fp32", "docs_per_s")
    if low is None or full is None:
        return NOT_MEASURED
    return f"{_get(r, 'packed', 'precision')} {low:,} against {full:,} docs/s", low >= full


def _job_share(r: dict) -> tuple[str, bool | None]:
    job = _get(r, "ndjson_end_to_end", "packed") or {}
    share = job.get("share_of_encode_only")
    if share is None:
        return NOT_MEASURED
    return f"{_pct(share)} ({job['docs_per_s']:,} docs/s)", share >= JOB_SHARE_OF_ENCODE


def _fp32_exact(r: dict) -> tuple[str, bool | None]:
    e = r.get("exact_packed_fp32_vs_reference_fp32")
    if not e:
        return NOT_MEASURED
    same = e["identical_id_sets"] == e["docs"] and e["nonfinite_reference"] == e["nonfinite_packed"]
    own = r.get("reference_fp32_vs_itself_at_a_quarter_batch")
    floor = f"; the reference against itself at a quarter of the batch: {own['identical_id_sets']:,}" if own else ""
    return (f"{e['identical_id_sets']:,} / {e['docs']:,} identical id sets, max |dw| {e['max_abs_dw']:.2g}, "
            f"non-finite {e['nonfinite_reference']} / {e['nonfinite_packed']}{floor}"), \
        same and e["max_abs_dw"] <= FP32_MAX_ABS_DW


def _budget(r: dict, precision: str) -> tuple[str, bool | None]:
    e = r.get(f"{precision}_vs_fp32_packed")
    if not e or "jaccard_mean" not in e:  # left out, or skipped (and why)
        return NOT_MEASURED
    show = f"{precision}: Jaccard {e['jaccard_mean']:.4f}, max |dw| {e['max_abs_dw']:.3g}"
    return show, e["jaccard_mean"] >= HALF_JACCARD and e["max_abs_dw"] <= HALF_MAX_ABS_DW


def _default_budget(r: dict) -> tuple[str, bool | None]:
    return _budget(r, _get(r, "packed", "precision"))


def _bf16_budget(r: dict) -> tuple[str, bool | None]:
    return _budget(r, "bf16")


def _mrr(r: dict) -> tuple[str, bool | None]:
    mrr, precision = r.get("mrr_at_10") or {}, _get(r, "packed", "precision")
    if precision not in mrr or "fp32" not in mrr:
        return NOT_MEASURED
    return f"{precision} {mrr[precision]} against {mrr['fp32']}", abs(mrr[precision] - mrr["fp32"]) <= HALF_MRR_DELTA


#: (target, the model it is read from: "bert" = the BERT-base-shaped model, "splade" = SPLADE-tiny, "both", what
#: it needs: "cuda" = a card's speed, "half" = the default encode in bf16 or fp16, "" = any run, judge)
TARGETS: tuple[tuple[str, str, str, Callable[[dict], tuple[str, bool | None]]], ...] = (
    (f"half-precision encode >= {PEAK_SHARE_PCT:.0f} % of the measured peak", "bert", "half", _peak_share),
    (f">= {SPEEDUP_OVER_REFERENCE:.0f}x the padded reference on the same card", "bert", "cuda", _speedup),
    (f"GPU busy >= {100 * GPU_BUSY_SHARE:.0f} % of the encode wall time", "bert", "cuda", _busy),
    (f"at most {HOST_SYNCS_PER_BATCH:.0f} host sync per batch", "both", "cuda", _syncs),
    ("no padded tokens on the packed path", "both", "", _padding),
    (f"peak GPU memory <= {PEAK_GPU_GB_AT_32K:.0f} GB at a 32k-token budget", "bert", "cuda", _memory),
    (f"SPLADE-tiny >= {SPLADE_TINY_DOCS_PER_S / 1000:.0f}k docs/s", "splade", "cuda", _splade_rate),
    ("SPLADE-tiny half precision >= fp32", "splade", "half", _half_over_fp32),
    (f"`lsr-os index --backend ndjson` >= {100 * JOB_SHARE_OF_ENCODE:.0f} % of encode-only", "both", "cuda", _job_share),
    (f"fp32 against the reference's fp32: identical id sets, max |dw| <= {FP32_MAX_ABS_DW:g}, equal non-finite counts",
     "both", "", _fp32_exact),
    (f"the default half precision against fp32: Jaccard >= {HALF_JACCARD}, max |dw| <= {HALF_MAX_ABS_DW}", "both",
     "half", _default_budget),
    (f"bf16 against fp32: Jaccard >= {HALF_JACCARD}, max |dw| <= {HALF_MAX_ABS_DW}", "both", "cuda", _bf16_budget),
    (f"the default half precision against fp32: dev MRR@10 within {HALF_MRR_DELTA}", "splade", "half", _mrr),
)


def _kind(model: str) -> str:
    return "splade" if model.lower().startswith("splade") else "bert"


def verdicts(result: dict) -> list[Verdict]:
    """Every target against every model of ``result`` it is read from (``gpu_encode.py``'s JSON)."""
    on_cuda = str(result.get("device", "")).startswith("cuda")
    out = []
    for target, which, needs, judge in TARGETS:
        for r in result.get("models", []):
            if which not in ("both", _kind(r["model"])):
                continue
            if needs and not on_cuda:
                measured, met = "a card's target: this run is on CPU", None
            elif needs == "half" and _get(r, "packed", "precision") not in HALF:
                measured, met = f"the default encode here is {_get(r, 'packed', 'precision')}, not bf16 / fp16", None
            else:
                measured, met = judge(r)
            out.append(Verdict(target, r["model"], measured, met))
    return out


def markdown(found: list[Verdict]) -> list[str]:
    """The verdicts as a markdown table (lines)."""
    mark = {True: "met", False: "**missed**", None: "-"}
    return ["| target | model | measured | |", "|---|---|---|---|",
            *[f"| {v.target} | {v.model} | {v.measured} | {mark[v.met]} |" for v in found]]


def main(argv: list[str] | None = None) -> list[Verdict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result", help="A gpu_encode.py JSON results file.")
    args = p.parse_args(argv)
    found = verdicts(json.loads(Path(args.result).read_text(encoding="utf-8")))
    print("\n".join(markdown(found)))
    return found


def as_json(found: list[Verdict]) -> list[dict]:
    return [asdict(v) for v in found]


if __name__ == "__main__":
    main()
