"""``lsr-os index --encoder-process`` against the in-process job, where the host sets the pace, in one run.

With ``--encoder-process`` (and with several GPUs) the job hands its chunks to an encoder process per device
(:class:`opensearch_lsr.encoding.parallel.DevicePool`). What that costs beside the in-process job is host work:
sending texts and vectors between processes, the worker waiting for chunks, starting and stopping it. On a CPU
a real model's own encoding hides all of it, so this benchmark encodes with a model small enough that the host
sets the pace: one random layer of width 16 over a small WordPiece vocabulary trained on the corpus
(:func:`opensearch_lsr.transfer.tokenizer_train.train_tokenizer` asked for 1,000 pieces; it keeps the corpus
alphabet, about 3,000 in all), its decoder bias shifted so a document keeps about 150 ids, as a trained model's
do. The settings alternate run by run over the same corpus; ``--baseline-tree DIR`` adds the ``--encoder-process`` job of another checkout (a
``git worktree`` of an older commit, say), measured in the same run.

    python benchmarks/encoder_process.py [--limit N] [--repeat 3] [--baseline-tree DIR] [--out F.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files
from gpu_encode import load_corpus, ndjson_end_to_end, random_mlm  # noqa: E402

from opensearch_lsr.transfer.tokenizer_train import train_tokenizer  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="The shared data folder.")
    ap.add_argument("--limit", type=int, default=None, help="Passages of the Korean corpus [default: all].")
    ap.add_argument("--repeat", type=int, default=3, help="Runs of each setting (they alternate).")
    ap.add_argument("--model", default=None, help="A model directory instead of the small host-bound one.")
    ap.add_argument("--baseline-tree", default=None,
                    help="Another checkout whose --encoder-process job is measured too (its package on PYTHONPATH).")
    ap.add_argument("--device", default="cpu", help="cpu or cuda.")
    ap.add_argument("--out", default=None, help="JSON results file (the markdown table goes next to it as .md).")
    args = ap.parse_args(argv)

    data = Path(args.data)
    corpus_file = data / "msmarco-ko" / "corpus.jsonl"
    _, texts = load_corpus(corpus_file, 1, args.limit)
    device = torch.device(args.device)
    settings = {"in process": ((), ROOT), "--encoder-process": (("--encoder-process",), ROOT)}
    if args.baseline_tree:
        baseline = Path(args.baseline_tree).resolve()
        settings[f"--encoder-process at {harness.git_commit(baseline)}"] = (("--encoder-process",), baseline)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.limit:
            corpus_file = work / "corpus.jsonl"
            with open(data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8") as src, open(corpus_file, "w") as dst:
                dst.writelines(line for _, line in zip(range(args.limit), src))
        vocabulary = None
        if args.model:
            model = args.model
        else:
            vocabulary = len(train_tokenizer(texts, 1000, work / "tok"))
            model = str(random_mlm(work / "tok", work / "model", texts, device, layers=1, hidden=16, heads=2,
                                   intermediate=32, target_nnz=150))
        runs: dict[str, list[dict]] = {name: [] for name in settings}
        for i in range(args.repeat):
            for name, (extra, root) in settings.items():
                res = ndjson_end_to_end(model, corpus_file, device, "packed", work, extra, root=root)
                if "error" in res:
                    raise SystemExit(f"{name}: {res['error']}")
                runs[name].append(res)
                print(f"run {i + 1}, {name}: {res['docs_per_s']:.0f} docs/s", flush=True)
    base = statistics.median(r["docs_per_s"] for r in runs["in process"])
    rows, summary = [], {}
    for name, rs in runs.items():
        med = statistics.median(r["docs_per_s"] for r in rs)
        summary[name] = {"docs_per_s": [r["docs_per_s"] for r in rs], "median_docs_per_s": med,
                         "x_in_process": round(med / base, 3), "runs": rs}
        rows.append([name, " / ".join(f"{r['docs_per_s']:.0f}" for r in rs), f"{med:.0f}", f"{med / base:.2f}",
                     f"{statistics.median(r['elapsed_s'] for r in rs):.2f}",
                     f"{statistics.median(r['encode_wait_s'] for r in rs):.2f}"])
    md = (f"{len(texts):,} Korean passages, `lsr-os index --backend ndjson --batching packed --device {device}`, "
          f"{args.model or f'the host-bound model (1 x 16, a {vocabulary:,}-piece vocabulary trained on the corpus)'}; "
          "settings alternate run by run.\n\n"
          + harness.markdown_table(["job", "docs/s per run", "median", "x in process", "elapsed s", "encode wait s"],
                                   rows))
    result = {"passages": len(texts), "device": str(device), "model": args.model or "host-bound random",
              "vocabulary": vocabulary, **summary}
    return harness.publish(result, md, args.out)


if __name__ == "__main__":
    main()
