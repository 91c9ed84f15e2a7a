"""Cross-lingual evaluation settings built from parallel BEIR copies.

Two BEIR directories hold the same queries (same query ids, same splits) in two languages and the
corpus each query is judged on, numbered per copy (``msmarco-ko``: ``ko-dN``, ``msmarco-en``:
``en-dN``). A setting picks the query language and the corpus:

* ``ko-ko`` Korean queries -> Korean corpus (the plain ``msmarco-ko`` evaluation),
* ``en-ko`` English queries -> Korean corpus (SPLADE-X's cross-language setting, Nair et al. 2022),
* ``ko-en`` Korean queries -> English corpus,
* ``mixed`` both corpora in one index, a query judged relevant on either copy of its passage
  (MILCO's mixed-language retrieval, Nguyen et al. 2025); Korean queries unless told otherwise.

Every setting is a :class:`~opensearch_lsr.evaluation.datasets.BeirDataset`, so ``run_evaluation``,
``evaluate_encoder`` and the benchmarks take it as they take ``load_beir``'s.

Text repair: about 20% of the English passages carry mojibake from the source file (``ItÊ¼s``,
``authorâ\\x80\\x99s``; data README). By default the English copy goes through ``ftfy.fix_text``
(Speer 2019, https://github.com/rspeer/python-ftfy), which repairs those; the Korean copy is kept
byte-identical so ``ko-ko`` equals ``lsr-os eval`` on ``msmarco-ko``.
"""
from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ..errors import LsrError
from .datasets import BeirDataset, load_beir

__all__ = ["Setting", "SETTINGS", "CrossLingualError", "CrossLingualSpec", "language_of", "parallel_copy",
           "read_queries_file", "repair_texts", "crosslingual_dataset", "setting_dataset", "mixed_dataset",
           "DEFAULT_REPAIR"]

Setting = Literal["ko-ko", "en-ko", "ko-en", "mixed"]
#: setting -> (query language, corpus language or "mixed")
SETTINGS: dict[str, tuple[str, str]] = {"ko-ko": ("ko", "ko"), "en-ko": ("en", "ko"), "ko-en": ("ko", "en"),
                                        "mixed": ("ko", "mixed")}
#: languages whose copy goes through ftfy by default (the English passages carry mojibake)
DEFAULT_REPAIR: tuple[str, ...] = ("en",)
MIXED = "mixed"


class CrossLingualError(LsrError, ValueError):
    """A parallel copy is missing or does not line up with the dataset (one sentence)."""


def language_of(directory: str | Path) -> str | None:
    """The language suffix of a dataset directory name (``msmarco-ko`` -> ``ko``), or None."""
    m = re.search(r"[-_]([a-z]{2,3})$", Path(directory).resolve().name)
    return m.group(1) if m else None


def parallel_copy(dataset: str | Path, language: str, parallel: str | Path | None = None) -> Path:
    """The BEIR directory holding ``dataset``'s queries/corpus in ``language``.

    ``dataset`` itself when ``language`` is its own (its ``-<lang>`` suffix); else ``parallel`` when given,
    else the sibling directory with the suffix swapped (``msmarco-ko`` + ``en`` -> ``msmarco-en``).
    """
    root = Path(dataset)
    own = language_of(root)
    if language == own:
        return root
    if parallel is not None:
        path = Path(parallel)
        if not (path / "corpus.jsonl").exists():
            raise CrossLingualError(f"the parallel copy {path} is not a BEIR dataset (no corpus.jsonl)")
        return path
    if own is None:
        raise CrossLingualError(f"cannot tell the language of {root} from its name (expected a -<lang> suffix such as "
                                f"msmarco-ko): pass the {language} copy with --parallel DIR")
    sibling = root.resolve().with_name(re.sub(r"([-_])[a-z]{2,3}$", rf"\g<1>{language}", root.resolve().name))
    if not (sibling / "corpus.jsonl").exists():
        raise CrossLingualError(f"no {language} copy of {root}: expected a BEIR dataset at {sibling} "
                                f"(same query ids); pass it with --parallel DIR")
    return sibling


def _only_sibling(root: Path) -> Path:
    """The one sibling copy of ``root`` (same name stem, another language suffix), for a mixed corpus."""
    own = language_of(root)
    stem = re.sub(r"[-_][a-z]{2,3}$", "", root.resolve().name) if own else None
    found = sorted(p for p in root.resolve().parent.glob(f"{stem}?*") if stem and p != root.resolve()
                   and language_of(p) not in (None, own) and p.name[:len(stem)] == stem
                   and len(p.name) - len(stem) in (3, 4) and (p / "corpus.jsonl").exists())
    if len(found) != 1:
        which = f" ({', '.join(p.name for p in found)})" if found else ""
        raise CrossLingualError(f"a mixed corpus needs the other copy of {root}: {len(found)} sibling copies "
                                f"found{which}; pass --parallel DIR or a --query-language other than the dataset's")
    return found[0]


def read_queries_file(path: str | Path) -> dict[str, str]:
    """Queries from a BEIR ``queries*.jsonl`` (``_id``, ``text``) or a ``qid<TAB>text`` TSV."""
    p = Path(path)
    if not p.is_file():
        raise CrossLingualError(f"queries file {p} does not exist")
    out: dict[str, str] = {}
    with open(p, encoding="utf-8") as fh:
        if p.suffix == ".jsonl":
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    out[str(row["_id"])] = str(row["text"])
                except (json.JSONDecodeError, KeyError, TypeError) as err:
                    raise CrossLingualError(f"{p}:{lineno}: expected a JSON object with _id and text ({err})") from err
        else:
            for lineno, row in enumerate(csv.reader(fh, delimiter="\t"), 1):
                if not row or (lineno == 1 and row[0] in ("query-id", "_id", "qid")):
                    continue
                if len(row) < 2:
                    raise CrossLingualError(f"{p}:{lineno}: expected qid<TAB>text")
                out[row[0]] = row[1]
    if not out:
        raise CrossLingualError(f"queries file {p} holds no query")
    return out


def repair_texts(texts: dict[str, str]) -> dict[str, str]:
    """``ftfy.fix_text`` on every value (mojibake such as ``authorâ\\x80\\x99s`` -> ``author's``)."""
    import ftfy

    return {k: ftfy.fix_text(v) for k, v in texts.items()}


def _load(directory: Path, split: str, repair: Sequence[str]) -> BeirDataset:
    ds = load_beir(directory, split)
    if language_of(directory) in repair:
        ds = BeirDataset(ds.name, ds.split, repair_texts(ds.corpus), repair_texts(ds.queries), ds.qrels)
    return ds


def _swap_queries(ds: BeirDataset, queries: dict[str, str], where: str) -> BeirDataset:
    missing = [q for q in ds.queries if q not in queries]
    if missing:
        raise CrossLingualError(f"{len(missing)} of the {len(ds.queries)} judged {ds.split} queries have no text in "
                                f"{where} (first: {missing[0]}); the copies must share query ids")
    return BeirDataset(ds.name, ds.split, ds.corpus, {q: queries[q] for q in ds.queries}, ds.qrels)


def mixed_dataset(a: BeirDataset, b: BeirDataset, labels: tuple[str, str] = ("a", "b")) -> BeirDataset:
    """Both corpora in one; a query's qrels are the union of its judgements on either copy.

    Queries (texts) come from ``a``. Document ids stay as they are when the copies number their
    passages apart (``ko-dN`` / ``en-dN``); otherwise each id gets its copy's label (``ko:dN``).
    """
    clash = a.corpus.keys() & b.corpus.keys()

    def ids(label: str):
        return (lambda d: f"{label}:{d}") if clash else (lambda d: d)

    fa, fb = ids(labels[0]), ids(labels[1])
    corpus = {fa(d): t for d, t in a.corpus.items()}
    corpus.update({fb(d): t for d, t in b.corpus.items()})
    qrels: dict[str, dict[str, int]] = {}
    for q in a.queries:
        judged = {fa(d): r for d, r in a.qrels.get(q, {}).items()}
        judged.update({fb(d): r for d, r in b.qrels.get(q, {}).items()})
        qrels[q] = judged
    return BeirDataset(f"{a.name}+{b.name}", a.split, corpus, dict(a.queries), qrels)


@dataclass
class CrossLingualSpec:
    """Which queries and which corpus to evaluate, relative to a dataset directory.

    Attributes:
        dataset: a BEIR directory (its language is its ``-<lang>`` name suffix, e.g. ``msmarco-ko``).
        split: the evaluated split (dev; never train queries in an evaluation).
        query_language: take the queries of the copy in this language (default: the dataset's own).
        corpus_language: search the corpus of the copy in this language, or ``mixed`` (the dataset's
            corpus and the query language's copy together; with the dataset's own queries, ``parallel`` or
            the one sibling copy; default: the dataset's own corpus).
        parallel: the other copy's directory (default: the sibling with the language suffix swapped).
        queries_file: replace the query texts by this file's (JSONL ``_id``/``text`` or ``qid<TAB>text``).
        repair: languages whose copy is repaired with ftfy (default: English).
    """

    dataset: str
    split: str = "dev"
    query_language: str | None = None
    corpus_language: str | None = None
    parallel: str | None = None
    queries_file: str | None = None
    repair: tuple[str, ...] = DEFAULT_REPAIR

    @property
    def plain(self) -> bool:
        """True when nothing differs from ``load_beir(dataset, split)``."""
        own = language_of(self.dataset)
        return (self.query_language in (None, own) and self.corpus_language in (None, own)
                and not self.queries_file and own not in self.repair)

    def build(self) -> BeirDataset:
        """The dataset of this setting (see the module docstring)."""
        root = Path(self.dataset)
        own = language_of(root)
        repair = tuple(self.repair)
        q_lang = self.query_language or own
        c_lang = self.corpus_language or own
        if c_lang == MIXED:
            if q_lang != own:
                other_dir = parallel_copy(root, q_lang, self.parallel)
            elif self.parallel:
                other_dir = Path(self.parallel)
            else:
                other_dir = _only_sibling(root)
            base, second = _load(root, self.split, repair), _load(other_dir, self.split, repair)
            q_copy, o_copy = (base, second) if q_lang == own else (second, base)
            q_dir, o_dir = (root, other_dir) if q_lang == own else (other_dir, root)
            ds = mixed_dataset(q_copy, o_copy, (language_of(q_dir) or "a", language_of(o_dir) or "b"))
        else:
            corpus_dir = parallel_copy(root, c_lang, self.parallel) if c_lang != own else root
            ds = _load(corpus_dir, self.split, repair)
            if q_lang != c_lang:
                q_dir = parallel_copy(root, q_lang, self.parallel) if q_lang != own else root
                queries = _load(q_dir, self.split, repair).queries
                ds = _swap_queries(ds, queries, str(q_dir))
        if self.queries_file:
            ds = _swap_queries(ds, read_queries_file(self.queries_file), self.queries_file)
        tag = f"{q_lang or '?'}->{c_lang or '?'}" + (" (queries file)" if self.queries_file else "")
        return BeirDataset(f"{ds.name} [{tag}]" if not self.plain else ds.name, ds.split, ds.corpus, ds.queries,
                           ds.qrels)


def crosslingual_dataset(dataset: str | Path, split: str = "dev", query_language: str | None = None,
                         corpus_language: str | None = None, parallel: str | Path | None = None,
                         queries_file: str | Path | None = None,
                         repair: Sequence[str] = DEFAULT_REPAIR) -> BeirDataset:
    """:class:`CrossLingualSpec` ``.build()`` in one call."""
    return CrossLingualSpec(str(dataset), split, query_language, corpus_language,
                            str(parallel) if parallel else None, str(queries_file) if queries_file else None,
                            tuple(repair)).build()


def setting_dataset(setting: str, ko_dir: str | Path, en_dir: str | Path | None = None, split: str = "dev",
                    mixed_query_language: Literal["ko", "en"] = "ko",
                    repair: Sequence[str] = DEFAULT_REPAIR) -> BeirDataset:
    """One of the four cross-lingual settings from the Korean copy (``en_dir``: default its ``-en`` sibling)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {', '.join(get_args(Setting))}, got {setting!r}")
    q_lang, c_lang = SETTINGS[setting]
    if setting == MIXED:
        q_lang = mixed_query_language
    return crosslingual_dataset(ko_dir, split, q_lang, c_lang, parallel_copy(ko_dir, "en", en_dir), repair=repair)
