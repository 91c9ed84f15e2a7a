"""Packed batching against the padded reference on CPU, taking turns block by block.

    python benchmarks/cpu_batching.py --models splade-tiny bert-tiny-random --out FILE

The default batching on CPU is packed (:mod:`opensearch_lsr.encoding.packed_runner`), which must not be slower
there than the padded path it replaced. One pass of each, one after the other (``gpu_encode.py``'s CPU form), moves
by 20-30 % from run to run on two shared cores, either way. Here the corpus is cut into blocks and both paths
encode every block, in an order that alternates from block to block and round to round, so a change in load hits
both alike; the ratio is of the summed wall times, each round's ratio beside it. The first round's vectors are
compared (fp32 both: the same id sets, max |dw| within 1e-5).

Models: ``splade-tiny`` (the installed SPLADE-tiny), ``bert-tiny-random`` (``gpu_encode.py``'s CPU model: 2 x 128,
random weights on the kobigbird vocabulary, the decoder bias shifted to about 200 ids a document) or a model
directory.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files
from gpu_encode import exactness, load_corpus, random_mlm  # noqa: E402

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402

PATHS = ("padded", "packed")


def model_dir(name: str, data: Path, texts: list[str], work: Path) -> str:
    """The directory ``name`` stands for (see the module docstring)."""
    if name == "bert-tiny-random":
        import torch

        return str(random_mlm(data / "kobigbird-bert-base-tokenizer", work / name, texts, torch.device("cpu"),
                              layers=2, hidden=128, heads=2, intermediate=512))
    if name == "splade-tiny":
        from opensearch_lsr.resources import splade_tiny_path

        return str(splade_tiny_path())
    return name


def take_turns(encoders: dict, texts: list[str], block: int, rounds: int) -> dict:
    """Every block encoded by every encoder, the order alternating per block and round: summed seconds per
    encoder, each round's seconds, and the first round's vectors."""
    blocks = [texts[a:a + block] for a in range(0, len(texts), block)]
    seconds = {name: [0.0] * rounds for name in encoders}
    first: dict[str, list] = {name: [] for name in encoders}
    for r in range(rounds):
        for k, chunk in enumerate(blocks):
            order = list(encoders) if (r + k) % 2 == 0 else list(encoders)[::-1]
            for name in order:
                t0 = time.perf_counter()
                vectors = encoders[name].encode(chunk)
                seconds[name][r] += time.perf_counter() - t0
                if r == 0:
                    first[name].extend(vectors)
    return {"seconds": seconds, "first_round": first}


def compare(name: str, model: str, texts: list[str], args: argparse.Namespace) -> dict:
    """docs/s of both paths over ``args.rounds`` rounds, their ratio and the first round's exactness."""
    encoders = {"padded": SparseDocumentEncoder(model, device="cpu", precision="fp32", batching="padded",
                                                batch_size=args.batch_size),
                "packed": SparseDocumentEncoder(model, device="cpu", precision="fp32", batching="packed")}
    for enc in encoders.values():  # first calls allocate and pick kernels: off the clock
        enc.encode(texts[:64])
    turns = take_turns(encoders, texts, args.block, args.rounds)
    total = {p: sum(turns["seconds"][p]) for p in PATHS}
    docs = len(texts) * args.rounds
    return {"model": name, "docs": len(texts), "rounds": args.rounds, "block": args.block,
            "tokens_per_doc": round(encoders["packed"].stats.tokens / max(encoders["packed"].stats.texts, 1), 1),
            "packed_batching": encoders["packed"].batching,
            **{f"{p}_docs_per_s": round(docs / total[p], 1) for p in PATHS},
            "packed_over_padded": round(total["padded"] / total["packed"], 3),
            "per_round": [round(a / b, 3) for a, b in zip(turns["seconds"]["padded"], turns["seconds"]["packed"])],
            "exactness": exactness(turns["first_round"]["padded"], turns["first_round"]["packed"])}


def markdown(rows: list[dict], threads: int) -> str:
    table = harness.markdown_table(
        ["model", "tokens / doc", "padded docs/s", "packed docs/s", "packed / padded", "each round",
         "same id sets", "max \\|dw\\|"],
        [[r["model"], f"{r['tokens_per_doc']:.1f}", f"{r['padded_docs_per_s']:.1f}", f"{r['packed_docs_per_s']:.1f}",
          f"{r['packed_over_padded']:.2f}x", " / ".join(f"{x:.2f}" for x in r["per_round"]),
          f"{r['exactness']['identical_id_sets']} / {r['exactness']['docs']}", f"{r['exactness']['max_abs_dw']:.1e}"]
         for r in rows])
    return (f"# Packed against padded batching on CPU ({threads} threads, fp32), taking turns per block\n\n{table}\n"
            "docs/s: all rounds' documents over the summed wall time; packed / padded: the ratio of those times.\n")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["splade-tiny", "bert-tiny-random"],
                   help="splade-tiny, bert-tiny-random or model directories [default: the first two].")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="The shared data folder.")
    p.add_argument("--limit", type=int, default=960, help="Korean passages (msmarco-ko) [default: 960].")
    p.add_argument("--block", type=int, default=240, help="Passages per turn [default: 240].")
    p.add_argument("--rounds", type=int, default=3, help="Passes over the passages [default: 3].")
    p.add_argument("--batch-size", type=int, default=32, help="Texts per pass of the padded path [default: 32].")
    p.add_argument("--threads", type=int, default=2, help="torch threads [default: 2].")
    p.add_argument("--out", default=None, help="JSON results file (the markdown table beside it as .md).")
    args = p.parse_args(argv)
    if min(args.limit, args.block, args.rounds, args.batch_size, args.threads) < 1:
        p.error("--limit, --block, --rounds, --batch-size and --threads must be at least 1")
    harness.set_threads(args.threads)
    data = Path(args.data)
    _, texts = load_corpus(data / "msmarco-ko" / "corpus.jsonl", 1, args.limit)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            rows.append(compare(name, model_dir(name, data, texts, Path(tmp)), texts, args))
            print(f"{name}: packed / padded {rows[-1]['packed_over_padded']}", file=sys.stderr, flush=True)
    result = {"threads": args.threads, "batch_size": args.batch_size, "rows": rows}
    return harness.publish(result, markdown(rows, args.threads), args.out)


if __name__ == "__main__":
    main()
