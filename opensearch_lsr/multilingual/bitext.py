"""Bitext for MILCO's Sparse Alignment Pretraining: read it, or build the MS MARCO ko/en one.

File formats (:func:`read_bitext`): a TSV of ``english<TAB>target`` lines, or a JSONL whose objects
have ``en`` and ``target`` string keys. The format is taken from the suffix (``.jsonl``/``.json`` vs
``.tsv``/``.txt``), else from the first non-empty line (``{`` = JSONL). A bad line raises one
:class:`BitextError` naming ``file:line``. Empty lines are skipped.

MS MARCO ko/en (:func:`build_msmarco_bitext`, spec ``msmarco:<ko_dir>,<en_dir>``): the two BEIR dirs
share query ids, so **train** queries pair by id; their passages are numbered differently in the two
corpora, so passages pair through the train qrels of the same query: a query with exactly one positive
on each side pairs those two passages (queries with several positives are ambiguous and skipped). Dev
queries are never read, and a passage that is a dev positive on either side is left out, so no dev
relevance label leaks into SAP.

Mojibake: about 20% of the msmarco-en passages carry UTF-8 read as Latin-1/cp1252 (``ItÊ¼s``,
``screamedâ\\x80\\x9d``). The default ``mojibake="repair"`` fixes them with ``ftfy.fix_text`` (Speer 2019,
PyPI ``ftfy``), which also normalises quotes; ``"keep"`` leaves the text as stored. Korean texts are
left unchanged.
"""
from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Literal

from ..config import sha256_file
from ..errors import LsrError

__all__ = ["BitextError", "read_bitext", "write_bitext", "build_msmarco_bitext", "resolve_bitext",
           "MOJIBAKE_MODES", "MSMARCO_PREFIX", "BITEXT_FILE"]

Mojibake = Literal["repair", "keep"]
MOJIBAKE_MODES: tuple[str, ...] = ("repair", "keep")
MSMARCO_PREFIX = "msmarco:"
#: where :func:`resolve_bitext` writes a built bitext (next to the model)
BITEXT_FILE = "bitext.jsonl"


class BitextError(LsrError, ValueError):
    """A bitext that cannot be read (missing file, bad line): one sentence naming ``file:line``."""


def _format_of(path: Path, first_line: str | None) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix in (".tsv", ".txt"):
        return "tsv"
    return "jsonl" if (first_line or "").lstrip().startswith("{") else "tsv"


def read_bitext(path: str | os.PathLike) -> list[tuple[str, str]]:
    """``[(english, target), ...]`` from a TSV (``english<TAB>target``) or JSONL (``en``, ``target``) file.

    Raises:
        BitextError: missing file, a line without exactly two non-empty fields / keys, invalid JSON,
            or a file without any pair.
    """
    path = Path(path)
    if not path.is_file():
        raise BitextError(f"bitext file {str(path)!r} does not exist")
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    fmt = _format_of(path, next((ln for ln in lines if ln.strip()), None))
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if fmt == "jsonl":
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise BitextError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("en"), str) or not isinstance(row.get("target"), str):
                raise BitextError(f"{where}: expected an object with string keys 'en' and 'target'")
            en, target = row["en"], row["target"]
        else:
            fields = line.split("\t")
            if len(fields) != 2:
                raise BitextError(f"{where}: expected 'english<TAB>target' (2 tab-separated fields), got {len(fields)}")
            en, target = fields
        if not en.strip() or not target.strip():
            raise BitextError(f"{where}: an empty English or target side")
        pairs.append((en, target))
    if not pairs:
        raise BitextError(f"bitext file {str(path)!r} holds no pairs")
    return pairs


def write_bitext(pairs: Iterable[tuple[str, str]], path: str | os.PathLike) -> Path:
    """Write ``pairs`` as JSONL (``{"en": .., "target": ..}`` per line; safe for texts holding tabs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for en, target in pairs:
            fh.write(json.dumps({"en": en, "target": target}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def _read_jsonl_texts(path: Path) -> dict[str, str]:
    out = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out[str(row["_id"])] = " ".join(t for t in (row.get("title") or "", row.get("text") or "") if t).strip()
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
                raise BitextError(f"{path}:{number}: not a BEIR row with '_id' and 'text' ({err})") from None
    return out


def _read_qrels(path: Path) -> dict[str, list[str]]:
    positives: dict[str, list[str]] = defaultdict(list)
    with open(path, encoding="utf-8") as fh:
        for number, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
            if number == 1 and row and row[0] == "query-id":
                continue
            if len(row) < 3:
                raise BitextError(f"{path}:{number}: expected 'query-id<TAB>corpus-id<TAB>score'")
            if float(row[2]) > 0:
                positives[row[0]].append(row[1])
    return positives


def _repairer(mojibake: str):
    if mojibake not in MOJIBAKE_MODES:
        raise ValueError(f"mojibake must be one of {', '.join(MOJIBAKE_MODES)}, got {mojibake!r}")
    if mojibake == "keep":
        return lambda text: text
    import ftfy

    return ftfy.fix_text


def build_msmarco_bitext(ko_dir: str | os.PathLike, en_dir: str | os.PathLike, *, queries: bool = True,
                         passages: bool = True, mojibake: Mojibake = "repair") -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The parallel MS MARCO train bitext: ``([(english, korean), ...], facts)``.

    Queries pair by id (train split only); passages pair through the train qrels (exactly one positive
    on each side), dev positives excluded; duplicate passage pairs are kept once. ``facts`` counts what
    was paired and skipped.
    """
    ko, en = Path(ko_dir), Path(en_dir)
    need = [d / "queries.train.jsonl" for d in (ko, en)] + [d / "qrels" / "train.tsv" for d in (ko, en)]
    if passages:
        need += [d / "corpus.jsonl" for d in (ko, en)]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise BitextError(f"not a BEIR MS MARCO pair of dirs: missing {', '.join(missing)}")
    fix = _repairer(mojibake)
    ko_q, en_q = _read_jsonl_texts(ko / "queries.train.jsonl"), _read_jsonl_texts(en / "queries.train.jsonl")
    pairs: list[tuple[str, str]] = []
    facts: dict[str, Any] = {"ko_dir": str(ko), "en_dir": str(en), "mojibake": mojibake, "split": "train"}
    shared = [q for q in ko_q if q in en_q]
    if queries:
        pairs += [(fix(en_q[q]), ko_q[q]) for q in shared]
        facts["query_pairs"] = len(shared)
    if passages:
        ko_pos, en_pos = _read_qrels(ko / "qrels" / "train.tsv"), _read_qrels(en / "qrels" / "train.tsv")
        dev_pos: set[str] = set()
        for d in (ko, en):
            if (d / "qrels" / "dev.tsv").is_file():
                dev_pos |= {p for ps in _read_qrels(d / "qrels" / "dev.tsv").values() for p in ps}
        ko_c, en_c = _read_jsonl_texts(ko / "corpus.jsonl"), _read_jsonl_texts(en / "corpus.jsonl")
        seen: set[tuple[str, str]] = set()
        ambiguous = dev_excluded = missing_text = added = 0
        for q in shared:
            k, e = ko_pos.get(q, []), en_pos.get(q, [])
            if len(k) != 1 or len(e) != 1:
                ambiguous += 1
                continue
            key = (e[0], k[0])
            if key in seen:
                continue
            seen.add(key)
            if e[0] in dev_pos or k[0] in dev_pos:
                dev_excluded += 1
                continue
            if e[0] not in en_c or k[0] not in ko_c:
                missing_text += 1
                continue
            pairs.append((fix(en_c[e[0]]), ko_c[k[0]]))
            added += 1
        facts.update(passage_pairs=added, skipped_ambiguous_queries=ambiguous,
                     skipped_dev_positives=dev_excluded, skipped_missing_text=missing_text)
    facts["pairs"] = len(pairs)
    return pairs, facts


def resolve_bitext(spec: str, out_dir: str | os.PathLike | None = None) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Pairs for a ``--bitext`` value: a file (:func:`read_bitext`) or ``msmarco:<ko_dir>,<en_dir>``
    (:func:`build_msmarco_bitext`, then written to ``out_dir/bitext.jsonl`` for provenance)."""
    if spec.startswith(MSMARCO_PREFIX):
        dirs = [d.strip() for d in spec[len(MSMARCO_PREFIX):].split(",")]
        if len(dirs) != 2 or not all(dirs):
            raise BitextError(f"expected msmarco:<ko_dir>,<en_dir>, got {spec!r}")
        pairs, facts = build_msmarco_bitext(dirs[0], dirs[1])
        if out_dir is not None:
            written = write_bitext(pairs, Path(out_dir) / BITEXT_FILE)
            facts["file"] = str(written)
            facts["sha256"] = sha256_file(written)
        return pairs, facts
    pairs = read_bitext(spec)
    return pairs, {"file": spec, "sha256": sha256_file(spec), "pairs": len(pairs)}
