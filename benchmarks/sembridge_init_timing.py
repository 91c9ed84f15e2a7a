"""Init-step timing: the exact fast path on the whole SPLADE-tiny -> kobigbird problem, the naive dense
computation on a row sample (extrapolated per row), peak extra memory of each, and the max difference
on the sampled rows, all in one run. Two naive references: dense entmax by float64 bisection (exact;
what the tests compare against) and the entmax package's default float32 bisection (what a plain
implementation would run; faster but only ~1e-6 exact).

    python benchmarks/sembridge_init_timing.py [--sample-rows 2048] [--out STEM]
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import psutil
import torch

from harness import machine, set_threads, write_results

from opensearch_lsr.resources import shared_data_dir
from opensearch_lsr.transfer.alignment import entmax_mixing, entmax_mixing_full, prepare_space
from opensearch_lsr.transfer.bridge import get_bridge
from opensearch_lsr.transfer.sembridge import SemBridgeConfig
from opensearch_lsr.transfer.surgery import load_source_model, load_target_tokenizer, mlm_parts
from opensearch_lsr.transfer.vocab import candidate_mask, find_overlap, token_surfaces


def peak_during(fn):
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak, stop = [base], []

    def watch():
        while not stop:
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    stop.append(1)
    th.join()
    return out, seconds, (peak[0] - base) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sample-rows", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="Also write STEM.json with the run's date, commit and machine.")
    args = ap.parse_args()
    set_threads(args.threads)
    start = machine()
    cfg = SemBridgeConfig()
    model, stok = load_source_model("splade-tiny")
    ttok = load_target_tokenizer(str(shared_data_dir() / "kobigbird-bert-base-tokenizer"))
    bridge = get_bridge(cfg.bridge, prompt=cfg.prompt)
    tv, sv = bridge.embed(token_surfaces(ttok)), bridge.embed(token_surfaces(stok))
    ov = find_overlap(stok, ttok)
    new = np.array([i for i in range(len(ttok)) if i not in ov])
    cand = np.flatnonzero(candidate_mask(stok, cfg.candidates))
    parts = mlm_parts(model)
    vals = torch.cat([parts.input_embeddings.weight, parts.output_bias[:, None]], 1).detach().numpy()[cand]
    t, s = prepare_space(tv, sv[cand], cfg.centering)
    t = t[new]

    def fast():
        u, inv = np.unique(t, axis=0, return_inverse=True)
        r = entmax_mixing(u, s, vals, cfg.alpha, cfg.temperature, top_k=cfg.top_k, block_size=cfg.block_size)
        return r.mixed[inv.reshape(-1)], r

    (mixed_fast, res), fast_s, fast_mb = peak_during(fast)
    rows = np.random.default_rng(0).choice(len(t), size=min(args.sample_rows, len(t)), replace=False)
    (mixed_naive, _), naive_s, naive_mb = peak_during(
        lambda: entmax_mixing_full(t[rows], s, vals, cfg.alpha, cfg.temperature, block_size=512))
    naive_full_est = naive_s * len(t) / len(rows)

    def naive_f32():
        # what a plain implementation does: the entmax package's bisection in float32, dense rows
        from entmax import entmax_bisect
        T, S = torch.from_numpy(t[rows]), torch.from_numpy(s)
        out = []
        with torch.inference_mode():
            for start in range(0, len(T), 512):
                p = entmax_bisect((T[start:start + 512] @ S.T) / cfg.temperature, alpha=cfg.alpha, dim=-1)
                out.append((p @ torch.from_numpy(vals)).numpy())
        return np.concatenate(out)

    mixed_f32, f32_s, f32_mb = peak_during(naive_f32)
    report = {
        "rows": int(len(t)), "candidates": int(len(cand)), "alpha": cfg.alpha, "temperature": cfg.temperature,
        "threads": args.threads, "load_average_1m": start["loadavg"][0],
        "fast_s": round(fast_s, 2), "fast_peak_extra_mb": round(fast_mb),
        "fast_fallback_rows": int(res.fallback_rows), "mean_support": round(float(res.support_sizes.mean()), 3),
        "naive_sample_rows": int(len(rows)), "naive_sample_s": round(naive_s, 2),
        "naive_peak_extra_mb": round(naive_mb), "naive_full_estimate_s": round(naive_full_est, 1),
        "speedup_estimate": round(naive_full_est / fast_s, 1),
        "naive_f32_sample_s": round(f32_s, 2), "naive_f32_peak_extra_mb": round(f32_mb),
        "naive_f32_full_estimate_s": round(f32_s * len(t) / len(rows), 1),
        "speedup_vs_f32_estimate": round(f32_s * len(t) / len(rows) / fast_s, 1),
        "max_abs_diff_f32_vs_float64_reference": float(np.abs(mixed_f32 - mixed_naive).max()),
        "max_abs_diff_on_sample": float(np.abs(mixed_fast[rows] - mixed_naive).max()),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        write_results(args.out, report)


if __name__ == "__main__":
    main()
