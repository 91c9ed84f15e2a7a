"""SemBridge alignment ablation on a dev subset (300 dev queries; their positives + 1,700 seeded
distractors = 2,000 passages): each argument is a JSON dict of SemBridgeConfig overrides.

    python benchmarks/sembridge_ablation.py '{"alpha": 4}' '{"alpha": 4, "temperature": 0.5}' ...

Absolute scores are higher than on the whole corpus: compare rows with each other only. The
untouched-source and BM25 references for the whole corpus come from sembridge_table.py.
"""
from __future__ import annotations

import argparse
import json
import os
import random

from harness import load_dataset, set_threads, time_call

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.evaluation.datasets import BeirDataset
from opensearch_lsr.evaluation.retrieval import evaluate_encoder
from opensearch_lsr.resources import shared_data_dir
from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer


def subset(n_queries: int = 300, n_distractors: int = 1700, seed: int = 0) -> BeirDataset:
    """The ablation's dev subset: the first ``n_queries`` judged queries, their positives and seeded distractors."""
    ds = load_dataset(max_queries=n_queries)
    pos = {d for q in ds.qrels.values() for d in q}
    others = [d for d in ds.corpus if d not in pos]
    random.Random(seed).shuffle(others)
    keep = list(pos) + others[:n_distractors]
    return BeirDataset(ds.name, ds.split, {d: ds.corpus[d] for d in keep}, ds.queries, ds.qrels)


def _overrides(spec: str) -> dict:
    try:
        kw = json.loads(spec)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err.msg}): {spec!r}") from err
    if not isinstance(kw, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of SemBridgeConfig fields, got {spec!r}")
    return kw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("settings", nargs="+", type=_overrides, metavar="JSON",
                        help='SemBridgeConfig overrides, one row each, e.g. \'{"alpha": 4}\' (\'{}\': the defaults)')
    args = parser.parse_args()
    set_threads(int(os.environ.get("LSR_THREADS", "2")))
    sub = subset()
    tok = str(shared_data_dir() / "kobigbird-bert-base-tokenizer")
    for kw in args.settings:
        name = "_".join(f"{k}{v}" for k, v in kw.items()) or "defaults"
        out = sembridge_transfer(SemBridgeConfig(source="splade-tiny", target_tokenizer=tok,
                                                 out=f"runs/ablation/{name}", **kw))
        cfg = json.loads((out / "transfer_config.json").read_text())
        timed = time_call(lambda: evaluate_encoder(SparseDocumentEncoder(str(out), batch_size=64), sub, batch_size=64))
        m = timed.result
        print(json.dumps({"cfg": kw, "mrr@10": round(m["mrr@10"], 4), "ndcg@10": round(m["ndcg@10"], 4),
                          "doc_dims": round(m["doc_active_dims"]), "query_dims": round(m["query_active_dims"], 1),
                          "support": round(cfg.get("mean_support_size", 0), 2),
                          "eval_s": round(timed.best)}), flush=True)


if __name__ == "__main__":
    main()
