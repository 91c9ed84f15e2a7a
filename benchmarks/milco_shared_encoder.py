"""Encode a corpus once for several MILCO models that share a frozen encoder (issue 15, cross-lingual rows).

MILCO models trained with SAP ``--train connector`` and ``lsr-os train --freeze-encoder all`` keep the
multilingual encoder's weights untouched, so their document vectors differ only in the LexEcho head. On 2
CPU cores the encoder forward is ~90% of a MILCO encode (multilingual-e5-small, 12 layers over ~150
tokens per passage); this script runs it once per batch and applies every model's head to the same token
states, then writes each model's document CSR into ``benchmarks/crosslingual.py``'s cache, where that
script's ``--row`` picks it up (same texts, same order, same special-column zeroing as ``encode_to_csr``).
It refuses models whose encoder weights differ (checked by hashing every encoder tensor).

    python benchmarks/milco_shared_encoder.py --lang ko --model runs/xl/milco-sap2-ft --model runs/xl/milco-nosap-ft

``--fill-states ko-corpus,ko-queries,...`` instead fills the frozen encoder's token-state cache
(opensearch_lsr.multilingual.state_cache) with the texts crosslingual.py encodes (corpora and dev queries at
the model's inference length, in resumable chunks, ``--max-minutes`` per call), after which crosslingual.py
encodes any frozen-encoder MILCO row with the head alone (``MilcoEncoder`` reads the cache by default):

    python benchmarks/milco_shared_encoder.py --fill-states ko-queries,en-queries,ko-corpus --model runs/xl/milco-sap2
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import crosslingual as xl  # noqa: E402  (the benchmark whose cache this fills)

from opensearch_lsr.contract import special_token_ids  # noqa: E402
from opensearch_lsr.multilingual.milco import is_milco_dir, load_milco  # noqa: E402


def encoder_digest(model) -> str:
    """sha1 over the encoder module's tensors (names, shapes and bytes)."""
    h = hashlib.sha1()
    for name, tensor in sorted(model[0].state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def encode_shared(models: list, texts: list[str], batch_size: int) -> list[sp.csr_matrix]:
    """Document CSR ``[n, V_src + V_en]`` per model from one encoder pass (length-sorted batches)."""
    encoder = models[0][0]
    order = np.argsort([-len(t) for t in texts], kind="stable")
    parts: list[list[sp.csr_matrix]] = [[] for _ in models]
    with torch.inference_mode():
        for start in tqdm(range(0, len(texts), batch_size), desc="shared encoder", unit="batch"):
            batch = [texts[i] for i in order[start:start + batch_size]]
            features = encoder(encoder.tokenize(batch))
            for k, model in enumerate(models):
                out = model[1](dict(features))["sentence_embedding"]
                parts[k].append(sp.csr_matrix(out.to(torch.float32).numpy()))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    mats = []
    specials = special_token_ids(models[0].tokenizer)
    for k in range(len(models)):
        mat = sp.vstack(parts[k]).tocsr()[inverse]
        if specials:  # encode_to_csr zeroes the tokenizer's special columns
            mask = np.ones(mat.shape[1], dtype=np.float32)
            mask[list(specials)] = 0.0
            mat = mat.multiply(mask[None, :]).tocsr()
        mat.eliminate_zeros()
        mats.append(mat)
    return mats


def fill_states(args) -> int:
    """Fill the state cache of the first ``--model``'s encoder with crosslingual.py's texts."""
    from opensearch_lsr.multilingual.state_cache import TokenStateCache

    model = load_milco(args.model[0])
    cache = TokenStateCache(model[0])
    st = xl.Settings(args.ko, args.en)
    budget = args.max_minutes * 60 if args.max_minutes else None
    t0 = time.perf_counter()
    for part in [p.strip() for p in args.fill_states.split(",") if p.strip()]:
        lang, _, what = part.partition("-")
        if lang not in ("ko", "en") or what not in ("corpus", "queries"):
            raise SystemExit(f"--fill-states takes ko-corpus, en-corpus, ko-queries, en-queries; got {part!r}")
        texts = list((st.corpus if what == "corpus" else st.queries)[lang].values())
        left = None if budget is None else max(0.0, budget - (time.perf_counter() - t0))
        facts = cache.fill(texts, model.max_seq_length, desc=part, max_seconds=left)
        print(json.dumps({"part": part, **facts}), flush=True)
        if facts["remaining"]:
            print(f"stopped at the time budget: {facts['remaining']} texts of {part} left (run again)")
            return 3
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ko", default="../shared/data/msmarco-ko")
    ap.add_argument("--en", default=None)
    ap.add_argument("--work", default="runs/xling", help="benchmarks/crosslingual.py's --work")
    ap.add_argument("--lang", choices=["ko", "en"], default=None, help="Which corpus to encode.")
    ap.add_argument("--fill-states", default=None,
                    help="Fill the token-state cache instead: comma-separated ko-corpus, en-corpus, ko-queries, en-queries.")
    ap.add_argument("--max-minutes", type=float, default=None, help="--fill-states: stop after this long (resumable).")
    ap.add_argument("--model", action="append", required=True, help="A MILCO dir (repeat).")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for m in args.model:
        if not is_milco_dir(m):
            ap.error(f"{m} is not a MILCO model directory")
    if args.fill_states:
        return fill_states(args)
    if args.lang is None:
        ap.error("--lang is required (or --fill-states)")
    models = [load_milco(m) for m in args.model]
    for m in models:
        m.eval()
    digests = {m: encoder_digest(model) for m, model in zip(args.model, models)}
    if len(set(digests.values())) != 1:
        ap.error(f"the models' encoders differ (sha1 {digests}); encode them separately")
    st = xl.Settings(args.ko, args.en)
    texts = list(st.corpus[args.lang].values())
    t0 = time.perf_counter()
    mats = encode_shared(models, texts, args.batch_size)
    seconds = round(time.perf_counter() - t0, 1)
    for m, mat in zip(args.model, mats):
        path = xl.model_cache(Path(args.work), m) / f"docs-{args.lang}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        sp.save_npz(path, mat)
        # the stage time reported by crosslingual.py: this shared pass, for all models together
        path.with_suffix(".time.json").write_text(json.dumps({"seconds": seconds, "shared_with": args.model}))
        print(f"{m}: {mat.shape[0]} docs, {mat.nnz / mat.shape[0]:.1f} active dims/doc -> {path}")
    print(f"shared encoder pass: {seconds} s for {len(models)} models (encoder sha1 {next(iter(digests.values()))[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
