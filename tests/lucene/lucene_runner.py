"""Run ``LuceneHarness.java`` (a real Lucene: Debian's ``liblucene8-java``, Lucene 8.8.1, or any directory of
Lucene 8.x jars in ``LUCENE_JARS``) from Python: nori tokens, BM25 top-k, FeatureField linear-query top-k."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

SOURCE = Path(__file__).with_name("LuceneHarness.java")
JARS = ("lucene-core", "lucene-analyzers-common", "lucene-analyzers-nori", "lucene-misc")
_WS = re.compile(r"[\t\r\n]")


def clean(text: str) -> str:
    """The one-line form both sides analyse (tab and line breaks are whitespace to nori as well)."""
    return _WS.sub(" ", text)


def find_jars(directory: str | None = None) -> list[Path] | None:
    """The four jars (newest version of each) in ``directory`` / ``$LUCENE_JARS`` / ``/usr/share/java``."""
    root = Path(directory or os.environ.get("LUCENE_JARS", "/usr/share/java"))
    out = []
    for name in JARS:
        found = sorted(root.glob(f"{name}-[0-9]*.jar"))
        if not found:
            return None
        out.append(found[-1])
    return out


def java_major() -> int | None:
    exe = shutil.which("java")
    if exe is None:
        return None
    res = subprocess.run([exe, "-version"], capture_output=True, text=True)
    m = re.search(r'version "(\d+)', res.stderr + res.stdout)
    return int(m.group(1)) if m else None


def unavailable() -> str | None:
    """Why the harness cannot run here (``None`` when it can)."""
    major = java_major()
    if major is None or major < 11:
        return "needs Java 11+ (apt-get install openjdk-17-jre-headless)"
    if find_jars() is None:
        return "needs the Lucene 8 jars (apt-get install liblucene8-java, or LUCENE_JARS=<dir>)"
    return None


class Lucene:
    """One call per command; inputs and outputs go through temporary TSV files."""

    def __init__(self, jars: list[Path] | None = None) -> None:
        self.jars = jars or find_jars()
        if not self.jars:
            raise RuntimeError(unavailable() or "no Lucene jars")
        self.classpath = os.pathsep.join(str(j) for j in self.jars)

    @property
    def version(self) -> str:
        import zipfile

        with zipfile.ZipFile(self.jars[0]) as zf:
            manifest = zf.read("META-INF/MANIFEST.MF").decode()
        m = re.search(r"Specification-Version: (\S+)", manifest)
        return m.group(1) if m else "?"

    def _run(self, cmd: str, *tables: Mapping[str, str], k: int | None = None) -> list[tuple[str, str]]:
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for i, table in enumerate(tables):
                p = Path(tmp) / f"in{i}.tsv"
                p.write_text("".join(f"{key}\t{value}\n" for key, value in table.items()), encoding="utf-8")
                paths.append(str(p))
            out = Path(tmp) / "out.tsv"
            args = ["java", "-cp", self.classpath, str(SOURCE), cmd, *paths, *([str(k)] if k else []), str(out)]
            res = subprocess.run(args, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"LuceneHarness {cmd} failed: {res.stderr[-2000:]}")
            rows = []
            for line in out.read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition("\t")
                rows.append((key, value))
            return rows

    def analyze(self, texts: Mapping[str, str]) -> dict[str, list[str]]:
        """``KoreanAnalyzer()`` terms of each text (OpenSearch's ``nori`` analyzer)."""
        return {key: value.split("\t") if value else [] for key, value in
                self._run("analyze", {k: clean(t) for k, t in texts.items()})}

    @staticmethod
    def _hits(value: str) -> list[tuple[str, float]]:
        out = []
        for pair in value.split():
            doc, _, score = pair.rpartition("=")
            out.append((doc, float(score)))
        return out

    def bm25(self, docs: Mapping[str, str], queries: Mapping[str, str], k: int = 10) -> dict[str, list[tuple[str, float]]]:
        """Top-``k`` of a ``match`` query on a nori ``text`` field under ``LegacyBM25Similarity(1.2, 0.75)``."""
        rows = self._run("bm25", {d: clean(t) for d, t in docs.items()}, {q: clean(t) for q, t in queries.items()}, k=k)
        return {q: self._hits(v) for q, v in rows}

    def bm25_pretokenized(self, docs: Mapping[str, list[str]], queries: Mapping[str, list[str]],
                          k: int = 10) -> dict[str, list[tuple[str, float]]]:
        """:meth:`bm25` over given term lists (the similarity alone)."""
        rows = self._run("bm25pre", {d: "\t".join(t) for d, t in docs.items()},
                         {q: "\t".join(t) for q, t in queries.items()}, k=k)
        return {q: self._hits(v) for q, v in rows}

    def features(self, docs: Mapping[str, Mapping[str, float]], queries: Mapping[str, Mapping[str, float]],
                 k: int = 10) -> dict[str, list[tuple[str, float]]]:
        """Top-``k`` of SHOULD ``FeatureField.newLinearQuery`` clauses over one ``FeatureField`` per feature."""
        def spec(vec: Mapping[str, float]) -> str:
            return " ".join(f"{t}={float(w)!r}" for t, w in vec.items() if " " not in t and "\t" not in t)

        rows = self._run("features", {d: spec(v) for d, v in docs.items()}, {q: spec(v) for q, v in queries.items()},
                         k=k)
        return {q: self._hits(v) for q, v in rows}
