"""Document-encoding throughput: SparseDocumentEncoder vs sentence-transformers vs a naive loop.

All figures come from one run, on the same texts, model, batch size, thread count and device:

* ``ours``: :class:`opensearch_lsr.encoding.encoder.SparseDocumentEncoder` (fp32), sparse output.
* ``st``: sentence-transformers ``SparseEncoder.encode_document`` (its default sparse output), the
  reference figure.
* ``naive``: ``AutoModelForMaskedLM`` logits ``[B, L, V]`` -> mask -> log1p(relu) -> max, per batch of
  the corpus in file order (what a first implementation would write).

The machine is shared, so the corpus is cut into blocks and the methods take turns on each block
(the order rotates per block): a change in load hits every method alike, and the ratios stay fair.
Wall time and process CPU time are both recorded; the load average is recorded per section.

Sections (``--sections``, results merged into the ``--out`` JSON after each one, so a run can be
continued section by section):

* ``speed``: docs/s of ours, st, naive; ratios; fp32 max |ours - st| over non-special dims (before
  pruning; special dims are zero in ours, as in the exported model, and not in st).
* ``bf16``: the bf16-autocast path against fp32 on the same blocks: docs/s, max |diff|, relative
  diff, and dev MRR@10 (1,000 queries, exact retrieval) with fp32 queries for both document sets.
* ``e2e``: encode-only vs the real ``lsr-os index`` job into the local backend and into the
  OpenSearch HTTP test double (``tests/opensearch/double``), one job per block into the same index,
  as a share of encode-only throughput; the final counts must equal the corpus size.

Example (the figures in ``benchmarks/results/encode_throughput.md``)::

    python benchmarks/encode_throughput.py --model runs/bench_sembridge/models/SemBridge_alpha4 \\
        --limit 0 --threads 2 --out runs/encode_throughput.json
    python benchmarks/encode_throughput.py --markdown runs/encode_throughput.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from harness import ROOT, Stages, corpus_texts, describe, load_dataset, run_info, set_threads, write_json

SECTIONS = ("speed", "bf16", "e2e")


def _texts(limit: int | None) -> tuple[list[str], list[str]]:
    """The first ``limit`` msmarco-ko passages (all with ``None``), in file order."""
    ids, texts = corpus_texts(load_dataset())
    return (ids[:limit], texts[:limit]) if limit else (ids, texts)


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _rotated(names: list[str], k: int) -> list[str]:
    k %= len(names)
    return names[k:] + names[:k]


def _dense_from_vectors(vectors, vocab: int) -> torch.Tensor:
    out = torch.zeros(len(vectors), vocab)
    for row, v in enumerate(vectors):
        out[row, torch.from_numpy(v.ids)] = torch.from_numpy(v.weights)
    return out


def _csr(vectors, vocab: int):
    import scipy.sparse as sp

    data = np.concatenate([v.weights for v in vectors]) if vectors else np.zeros(0, np.float32)
    ind = np.concatenate([v.ids for v in vectors]) if vectors else np.zeros(0, np.int64)
    ptr = np.concatenate([[0], np.cumsum([len(v.ids) for v in vectors])])
    return sp.csr_matrix((data, ind, ptr), shape=(len(vectors), vocab))


class _Naive:
    """The straightforward loop: full ``[B, L, V]`` logits, no sorting by length."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoModelForMaskedLM

        from opensearch_lsr.transfer.surgery import load_target_tokenizer, resolve_model_path

        path = resolve_model_path(model_dir)
        self.tok = load_target_tokenizer(path)
        self.model = AutoModelForMaskedLM.from_pretrained(path).eval()

    def __call__(self, texts: list[str], batch_size: int) -> torch.Tensor:
        out = []
        with torch.inference_mode():
            for s in range(0, len(texts), batch_size):
                b = self.tok(texts[s:s + batch_size], padding=True, truncation=True, max_length=512,
                             return_tensors="pt", return_token_type_ids=False)
                logits = self.model(**b).logits
                out.append(torch.log1p(torch.relu(logits * b["attention_mask"].unsqueeze(-1))).amax(1))
        return torch.cat(out)


def _vectors_path(out: Path) -> Path:
    return out.with_suffix(".fp32_vectors.npz")


def _save_vectors(path: Path, vectors) -> None:
    np.savez(path, ids=np.concatenate([v.ids for v in vectors]), weights=np.concatenate([v.weights for v in vectors]),
             lens=np.array([len(v.ids) for v in vectors]))


def _load_vectors(path: Path) -> list:
    from opensearch_lsr.encoding.encoder import SparseVector

    z = np.load(path)
    cuts = np.cumsum(z["lens"])[:-1]
    return [SparseVector(i, w) for i, w in zip(np.split(z["ids"], cuts), np.split(z["weights"], cuts))]


def _vectors_sha1(vectors) -> str:
    import hashlib

    h = hashlib.sha1()
    for v in vectors:
        h.update(v.ids.tobytes())
        h.update(np.round(v.weights, 5).tobytes())
    return h.hexdigest()


def _section_speed(args, ids, texts, enc) -> tuple[dict, list]:
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    st = load_sparse_encoder(args.model)
    naive = None if args.skip_naive else _Naive(args.model)
    bs = args.batch_size
    warm = texts[:bs]  # warm-up outside the clock
    enc.encode(warm)
    st.encode_document(warm, batch_size=bs)
    if naive is not None:
        naive(warm, bs)
    keep = torch.ones(enc.vocab_size, dtype=torch.bool)
    keep[enc.special_ids] = False
    clock, diff, naive_diff, ours_all = Stages(), 0.0, 0.0, []
    names = ["ours", "st"] + (["naive"] if naive is not None else [])
    # The naive loop is the slowest by far: on a busy machine it may run on every N-th block only, and
    # is then compared with ours on exactly those blocks ("ours@naive").
    naive_docs = st_docs = 0
    for k, (a, b) in enumerate(_blocks(len(texts), args.block)):
        block = texts[a:b]
        got: dict[str, object] = {}
        ours_before = clock.seconds.get("ours", 0.0)
        with_naive = naive is not None and k % args.naive_every == 0
        with_st = k % args.st_every == 0
        for name in _rotated(names, k):
            if (name == "naive" and not with_naive) or (name == "st" and not with_st):
                continue
            if name == "ours":
                got[name] = clock.call(name, lambda: enc.encode(block))
            elif name == "st":
                got[name] = clock.call(name, lambda: st.encode_document(block, batch_size=bs))
            else:
                got[name] = clock.call(name, lambda: naive(block, bs))
                naive_docs += len(block)
        ours_block = clock.seconds["ours"] - ours_before  # ours' time on this block
        if with_naive:
            clock.seconds["ours@naive"] = clock.seconds.get("ours@naive", 0.0) + ours_block
        if with_st:
            clock.seconds["ours@st"] = clock.seconds.get("ours@st", 0.0) + ours_block
            st_docs += len(block)
            ref = got["st"]
            ref = (ref.to_dense() if ref.is_sparse else ref).float()
            ours = _dense_from_vectors(got["ours"], enc.vocab_size)
            diff = max(diff, float((ours[:, keep] - ref[:, keep]).abs().max()))
            if with_naive:
                naive_diff = max(naive_diff, float((got["naive"][:, keep] - ref[:, keep]).abs().max()))
        ours_all.extend(got["ours"])
        print(f"speed block {k}: {b}/{len(texts)} docs, wall so far "
              + ", ".join(f"{n} {clock.seconds[n]:.1f}s" for n in names), file=sys.stderr, flush=True)
    n = len(texts)
    res = {"ours_docs_per_s": n / clock.seconds["ours"], "st_docs": st_docs, "st_every": args.st_every,
           "st_docs_per_s": st_docs / clock.seconds["st"], "ours_on_st_blocks_docs_per_s": st_docs / clock.seconds["ours@st"]}
    res.update({f"{m}_wall_s": clock.seconds[m] for m in names})
    res.update({f"{m}_cpu_s": clock.cpu[m] for m in names})
    res["ours_on_st_blocks_wall_s"] = clock.seconds["ours@st"]
    res["speedup_vs_st"] = clock.seconds["st"] / clock.seconds["ours@st"]
    if naive is not None:
        res["naive_docs"] = naive_docs
        res["naive_every"] = args.naive_every
        res["naive_docs_per_s"] = naive_docs / clock.seconds["naive"]
        res["ours_on_naive_blocks_docs_per_s"] = naive_docs / clock.seconds["ours@naive"]
        res["speedup_vs_naive"] = clock.seconds["naive"] / clock.seconds["ours@naive"]
        res["naive_max_abs_diff_vs_st"] = naive_diff
    res["fp32_max_abs_diff_vs_st"] = diff
    res["avg_tokens_per_doc"] = enc.stats.tokens / max(enc.stats.texts, 1)
    return res, ours_all


def _section_bf16(args, ids, texts, enc, fp32_vectors) -> dict:
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from opensearch_lsr.evaluation.retrieval import top_k_run

    bf = SparseDocumentEncoder(args.model, device="cpu", precision="bf16", batch_size=args.batch_size)
    bf.encode(texts[:args.batch_size])
    clock, max_abs, max_rel, bf_all, fp_all = Stages(), 0.0, 0.0, [], []
    jacc, timed_docs, repeat_ok = [], 0, True
    for k, (a, b) in enumerate(_blocks(len(texts), args.block)):
        block = texts[a:b]
        got = {}
        bf_before = clock.seconds.get("bf16", 0.0)
        # fp32 is re-run (interleaved, for the speed ratio) on every N-th block when the speed
        # section's fp32 vectors are at hand; they are the reference for the other blocks.
        rerun = not fp32_vectors or k % args.fp32_every == 0
        if not rerun:
            got["fp32"] = fp32_vectors[a:b]
        for name in _rotated(["fp32", "bf16"], k):
            if name == "fp32" and not rerun:
                continue
            e = enc if name == "fp32" else bf
            key = name if rerun else "bf16_untimed"
            got[name] = clock.call(key, lambda: e.encode(block))
        if rerun:
            timed_docs += b - a
            clock.seconds["bf16@fp32"] = clock.seconds.get("bf16@fp32", 0.0) + clock.seconds["bf16"] - bf_before
            if fp32_vectors:
                repeat_ok &= all(np.array_equal(x.ids, y.ids) and np.allclose(x.weights, y.weights, atol=1e-6)
                                 for x, y in zip(fp32_vectors[a:b], got["fp32"]))
        lo = _dense_from_vectors(got["bf16"], enc.vocab_size)
        hi = _dense_from_vectors(got["fp32"], enc.vocab_size)
        d = (lo - hi).abs()
        max_abs = max(max_abs, float(d.max()))
        max_rel = max(max_rel, float((d.amax(1) / hi.amax(1).clamp_min(1e-6)).max()))
        inter = ((lo > 0) & (hi > 0)).sum(1).float()
        union = ((lo > 0) | (hi > 0)).sum(1).float().clamp_min(1)
        jacc.append(inter / union)
        bf_all.extend(got["bf16"])
        fp_all.extend(got["fp32"])
        print(f"bf16 block {k}: {b}/{len(texts)}, fp32 {clock.seconds['fp32']:.1f}s bf16 {clock.seconds['bf16']:.1f}s",
              file=sys.stderr, flush=True)
    n = len(texts)
    bf_wall = clock.seconds["bf16"] + clock.seconds.get("bf16_untimed", 0.0)
    res = {"bf16_docs_per_s": n / bf_wall, "fp32_docs_per_s": timed_docs / clock.seconds["fp32"],
           "bf16_docs_per_s_on_fp32_blocks": timed_docs / clock.seconds["bf16@fp32"], "fp32_timed_docs": timed_docs,
           "bf16_speed_vs_fp32": clock.seconds["fp32"] / clock.seconds["bf16@fp32"],
           "bf16_max_abs_diff_vs_fp32": max_abs, "bf16_max_rel_diff_vs_fp32": max_rel,
           "bf16_mean_active_set_jaccard": float(torch.cat(jacc).mean()),
           "cpu_bf16_native": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if len(texts) == 7279 or args.force_mrr:
        ds = load_dataset()
        pos = {d: i for i, d in enumerate(ids)}
        dids = [d for d in ds.corpus if d in pos]  # all of them unless --limit (then: a labelled subset)
        order = [pos[d] for d in dids]
        kept = set(dids)  # on a --limit subset: only the queries with a judged passage in it
        qids = [q for q in ds.queries if any(d in kept and r > 0 for d, r in ds.qrels.get(q, {}).items())]
        res["mrr_corpus_docs"], res["mrr_queries"] = len(dids), len(qids)
        qrels = {q: ds.qrels[q] for q in qids}
        qtexts = [ds.queries[q] for q in qids]
        q32 = _csr(enc.encode(qtexts), enc.vocab_size)
        qbf = _csr(bf.encode(qtexts), enc.vocab_size)
        d32 = _csr([fp_all[i] for i in order], enc.vocab_size)
        dbf = _csr([bf_all[i] for i in order], enc.vocab_size)
        res["mrr10_fp32"] = float(evaluate_run(qrels, top_k_run(q32, d32, qids, dids, k=100))["mrr@10"])
        res["mrr10_bf16_docs"] = float(evaluate_run(qrels, top_k_run(q32, dbf, qids, dids, k=100))["mrr@10"])
        res["mrr10_bf16_docs_and_queries"] = float(
            evaluate_run(qrels, top_k_run(qbf, dbf, qids, dids, k=100))["mrr@10"])
        res["mrr10_delta_bf16_docs"] = res["mrr10_bf16_docs"] - res["mrr10_fp32"]
    if fp32_vectors:  # the speed section's fp32 vectors are what a re-run gives
        res["fp32_vectors_repeatable"] = bool(repeat_ok)
    return res


class _double:
    """The OpenSearch HTTP test double (``tests/opensearch/double``), by default in its own
    process, as a real cluster would be: its request handling (spec validation, indexing) is then not
    charged to the encoding process's CPU and GIL."""

    def __init__(self, in_process: bool) -> None:
        self.in_process = in_process

    def __enter__(self) -> str:
        if self.in_process:
            sys.path.insert(0, str(ROOT / "tests" / "opensearch"))
            from double.server import OpenSearchDouble

            self.double = OpenSearchDouble().start()
            return self.double.url
        code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from double.server import OpenSearchDouble; "
                "d = OpenSearchDouble().start(); print(d.url, flush=True); sys.stdin.read()")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "tests" / "opensearch")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self.proc.stdout.readline().strip()

    def __exit__(self, *exc) -> None:
        if self.in_process:
            self.double.stop()
        else:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def _section_e2e(args, ids, texts, enc) -> dict:
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job
    from opensearch_lsr.local.index import LocalIndex
    from opensearch_lsr.opensearch.client import make_client

    clock = Stages()
    enc.encode(texts[:args.batch_size])
    res: dict = {"double_in_process": args.double_in_process}
    with tempfile.TemporaryDirectory() as tmp, _double(args.double_in_process) as url:
        tmp = Path(tmp)
        client = make_client(url)
        mapping = {"mappings": {"properties": {
            "id": {"type": "keyword"}, "text": {"type": "text"}, "sparse_embedding": {"type": "rank_features"}}}}
        # One index per block for both backends: each job then refreshes (and the local backend
        # opens) an index of its own block's size, so the sum over blocks costs what one job over
        # all the passages would, instead of re-opening/refreshing an ever larger index.
        e2e_docs, local_count, double_count = 0, 0, 0
        for k, (a, b) in enumerate(_blocks(len(texts), args.block)):
            if k % args.e2e_every:
                continue
            e2e_docs += b - a
            corpus = tmp / f"block{k}.jsonl"
            corpus.write_text("".join(json.dumps({"_id": i, "text": t}, ensure_ascii=False) + "\n"
                                      for i, t in zip(ids[a:b], texts[a:b])), encoding="utf-8")
            client.indices.create(index=f"bench-{k}", body=mapping)
            for name in _rotated(["encode_only", "local", "double"], k):
                if name == "encode_only":
                    clock.call(name, lambda: enc.encode(texts[a:b]))
                    continue
                cfg = IndexJobConfig(corpus=str(corpus), model=args.model, batch_size=args.batch_size,
                                     backend="local" if name == "local" else "opensearch",
                                     index=str(tmp / f"local{k}") if name == "local" else f"bench-{k}",
                                     work_dir=str(tmp / f"{name}{k}.job"))
                s = clock.call(name, lambda: run_index_job(
                    cfg, encoder=enc, client_factory=lambda: client, progress=False))
                assert s["indexed"] == b - a and s["dead_lettered"] == 0, s
                res[f"{name}_peak_rss_mb"] = s["peak_rss_mb"]
            idx = LocalIndex.open(tmp / f"local{k}")
            idx.refresh()
            local_count += idx.count()
            double_count += int(client.count(index=f"bench-{k}")["count"])
            print(f"e2e block {k}: {b}/{len(texts)}, " + ", ".join(f"{n} {v:.1f}s" for n, v in clock.seconds.items()),
                  file=sys.stderr, flush=True)
        res["local_count"], res["double_count"] = local_count, double_count
    n = res["e2e_docs"] = e2e_docs
    res["e2e_every"] = args.e2e_every
    for name in ("encode_only", "local", "double"):
        res[f"{name}_docs_per_s"] = n / clock.seconds[name]
        res[f"{name}_wall_s"] = clock.seconds[name]
        res[f"{name}_cpu_s"] = clock.cpu[name]
    for name in ("local", "double"):
        res[f"{name}_share_of_encode_only"] = clock.seconds["encode_only"] / clock.seconds[name]
    return res


def args_block_note(section: dict) -> str:
    return f"{section.get('docs')} passages"


def _markdown(path: Path) -> str:
    r = json.loads(path.read_text())
    run = r.get("run")
    lines = ([f"Run: {run['date']}, commit `{run['commit']}`, `{run['command']}`; machine: {describe(run['machine'])}.",
              ""] if run else [])
    lines += [f"model `{r['model']}`, batch {r['batch_size']}, {r['threads']} threads, "
              f"device {r['device']} (GPU present: {r['gpu']}), torch {r.get('torch')}", ""]
    if "speed" in r:
        s = r["speed"]
        lines += ["| method | docs/s | wall s | CPU s | ours is x faster |", "|---|---|---|---|---|"]
        lines.append(f"| SparseDocumentEncoder (fp32), all {r['speed'].get('docs', r['docs'])} passages | "
                     f"{s['ours_docs_per_s']:.1f} | {s['ours_wall_s']:.1f} | {s['ours_cpu_s']:.1f} | 1.00 |")
        lines.append(f"| sentence-transformers encode_document ({s['st_docs']} docs: every {s['st_every']}th block; "
                     f"ours {s['ours_on_st_blocks_docs_per_s']:.1f} docs/s there) | {s['st_docs_per_s']:.1f} | "
                     f"{s['st_wall_s']:.1f} | {s['st_cpu_s']:.1f} | {s['speedup_vs_st']:.2f} |")
        if "naive_docs_per_s" in s:
            lines.append(f"| naive transformers loop ({s['naive_docs']} docs: every {s['naive_every']}th block; ours "
                         f"{s['ours_on_naive_blocks_docs_per_s']:.1f} docs/s there) | {s['naive_docs_per_s']:.1f} | "
                         f"{s['naive_wall_s']:.1f} | {s['naive_cpu_s']:.1f} | {s['speedup_vs_naive']:.2f} |")
        lines += ["", f"fp32 max |ours - st| (non-special dims, before pruning): {s['fp32_max_abs_diff_vs_st']:.2e}; "
                  f"load average {s.get('loadavg_start')} -> {s.get('loadavg_end')}", ""]
    if "bf16" in r:
        b = r["bf16"]
        lines += [f"bf16 section: {b.get('docs', r['docs'])} passages, MRR@10 over {b.get('mrr_corpus_docs')} passages "
                  f"and {b.get('mrr_queries', 'all')} dev queries", "",
                  "| precision | docs/s | max abs diff vs fp32 | max rel diff | active-set Jaccard | dev MRR@10 |",
                  "|---|---|---|---|---|---|",
                  f"| fp32 | {b['fp32_docs_per_s']:.1f} | 0 | 0 | 1 | {b.get('mrr10_fp32', float('nan')):.4f} |",
                  f"| bf16 autocast (docs) | {b['bf16_docs_per_s']:.1f} | {b['bf16_max_abs_diff_vs_fp32']:.3f} | "
                  f"{b['bf16_max_rel_diff_vs_fp32']:.3f} | {b['bf16_mean_active_set_jaccard']:.3f} | "
                  f"{b.get('mrr10_bf16_docs', float('nan')):.4f} |", "",
                  f"bf16 docs+queries MRR@10 {b.get('mrr10_bf16_docs_and_queries', float('nan')):.4f}; CPU capability "
                  f"{b['cpu_capability']}, native bf16 {b['cpu_bf16_native']}; load average "
                  f"{b.get('loadavg_start')} -> {b.get('loadavg_end')}", ""]
    if "e2e" in r:
        e = r["e2e"]
        lines += [f"e2e section: {e.get('e2e_docs')} passages (every {e.get('e2e_every', 1)}th block of "
                  f"{args_block_note(e)})", "",
                  "| path | docs/s | wall s | share of encode-only |", "|---|---|---|---|",
                  f"| encode only | {e['encode_only_docs_per_s']:.1f} | {e['encode_only_wall_s']:.1f} | 100% |",
                  f"| `lsr-os index` job -> local backend | {e['local_docs_per_s']:.1f} | {e['local_wall_s']:.1f} | "
                  f"{100 * e['local_share_of_encode_only']:.1f}% |",
                  f"| `lsr-os index` job -> OpenSearch test double | {e['double_docs_per_s']:.1f} | "
                  f"{e['double_wall_s']:.1f} | {100 * e['double_share_of_encode_only']:.1f}% |", "",
                  f"final counts: local {e['local_count']}, double {e['double_count']}; load average "
                  f"{e.get('loadavg_start')} -> {e.get('loadavg_end')}", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="splade-tiny", help="SparseEncoder dir (or splade-tiny)")
    ap.add_argument("--limit", type=int, default=256, help="corpus passages (0 = all 7,279)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block", type=int, default=512, help="passages per interleaving block")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--naive-every", type=int, default=1, help="run the naive loop on every N-th block only")
    ap.add_argument("--st-every", type=int, default=1,
                    help="run sentence-transformers on every N-th block only (compared with ours on those blocks)")
    ap.add_argument("--double-in-process", action="store_true",
                    help="e2e: run the OpenSearch test double inside the benchmark process (default: its own)")
    ap.add_argument("--e2e-every", type=int, default=1, help="e2e section: every N-th block only")
    ap.add_argument("--fp32-every", type=int, default=1,
                    help="bf16 section: re-time fp32 on every N-th block (others reuse the speed section's vectors)")
    ap.add_argument("--force-mrr", action="store_true", help="compute MRR@10 even on a --limit subset")
    ap.add_argument("--out", type=Path, default=None, help="JSON results file (merged section by section)")
    ap.add_argument("--markdown", type=Path, default=None, help="print the tables of a results JSON and exit")
    args = ap.parse_args()
    if args.markdown:
        print(_markdown(args.markdown))
        return
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
    set_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder

    ids, texts = _texts(args.limit or None)
    enc = SparseDocumentEncoder(args.model, device="cpu", precision="fp32", batch_size=args.batch_size)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    result = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}
    info = run_info()
    result.update({"model": args.model, "docs": len(texts), "batch_size": args.batch_size, "threads": args.threads,
                   "device": "cpu", "gpu": torch.cuda.is_available(), "torch": torch.__version__,
                   "commit": info["commit"], "run": info})
    fp32_vectors: list = []
    if "bf16" in sections and "speed" not in sections and args.out and _vectors_path(args.out).exists():
        fp32_vectors = _load_vectors(_vectors_path(args.out))
        if len(fp32_vectors) != len(texts):
            fp32_vectors = []
    for section in sections:
        start = [round(x, 2) for x in os.getloadavg()]
        stages = Stages()
        with stages(section):
            if section == "speed":
                res, fp32_vectors = _section_speed(args, ids, texts, enc)
                if args.out:  # the bf16 section (maybe a later run) compares against these exact vectors
                    _save_vectors(_vectors_path(args.out), fp32_vectors)
                res["ours_vectors_sha1"] = _vectors_sha1(fp32_vectors)
            elif section == "bf16":
                res = _section_bf16(args, ids, texts, enc, fp32_vectors)
            else:
                res = _section_e2e(args, ids, texts, enc)
        res.update({"docs": len(texts), "loadavg_start": start, "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                    "section_wall_s": round(stages.seconds[section], 1), "measured": time.strftime("%Y-%m-%d %H:%M"),
                    "commit": info["commit"]})
        result[section] = res
        if args.out:
            write_json(args.out, result)
        print(json.dumps({section: res}, indent=2), flush=True)


if __name__ == "__main__":
    main()
