"""The PyTorch native cache of ML Commons for air-gapped clusters (the ``airgap-kit`` command).

The first deploy of a TORCH_SCRIPT (or ONNX) model makes DJL download libtorch and its JNI
library from ``https://publish.djl.ai``; a node that cannot reach that host fails the deploy task
with the error ``publish.djl.ai`` (an ``UnknownHostException``; the node log says "Failed to save
pytorch index file"; opensearch-project/ml-commons#3670). DJL skips the download when the cache
folder already holds ``libtorch.so``, so the offline route is to fill that folder on every ML node
from DJL's artifacts on Maven Central before the first deploy. This module plans, assembles
(with sha256 sums) and installs that folder.

Server behaviour relied on (read at the tags named):

* ml-commons ``ml-algorithms/.../DLModel.java`` ``doLoadModel`` sets ``PYTORCH_PRECXX11=true``,
  ``PYTORCH_VERSION=2.5.1`` and ``DJL_CACHE_DIR=<path.data>/ml_cache`` (3.0.0.0 to 3.8.0.0;
  ``1.13.1`` at 2.15.0.0-2.19.6.0); ``ml-algorithms/build.gradle`` pins ``ai.djl:bom:0.31.1``
  (2.19.0.0-3.8.0.0).
* DJL v0.31.1 ``engines/pytorch/pytorch-engine/.../jni/LibUtils.java``: ``downloadPyTorch`` returns
  the folder ``<DJL_CACHE_DIR>/pytorch/<version>-<flavor>-<classifier>`` when it holds
  ``libtorch.so`` (flavor ``cpu`` + ``-precxx11`` when ``PYTORCH_PRECXX11`` is true), and
  ``findJniLibrary`` takes ``<that folder>/0.31.1-libdjl_torch.so`` before any download.
* Maven Central holds ``ai.djl.pytorch:pytorch-native-cpu:2.5.1:linux-x86_64`` (the cxx11-ABI
  libtorch; no ``pytorch-native-cpu-precxx11`` 2.5.1 was published) and
  ``ai.djl.pytorch:pytorch-jni:2.5.1-0.32.0`` (no ``2.5.1-0.31.1``). The JNI of the ``cpu`` flavor is
  taken so that both libraries share the cxx11 ABI; the folder name only keys DJL's cache. The
  native-method table of ``PyTorchLibrary.java`` is identical in DJL v0.31.1 and v0.32.0, and the
  kit was deployed and ``_predict``-checked on OpenSearch 3.6.0 (``tests/opensearch_real``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from ..errors import LsrError
from .client import parse_version

__all__ = ["DjlNatives", "AirgapError", "natives_for", "kit_plan", "fetch_jars", "build_kit", "install_kit",
           "check_cache", "SUMS_FILE", "DJL_DOWNLOAD_MARKERS"]

#: Written next to the libraries in the kit folder: ``<sha256>  <file>`` lines (``sha256sum -c`` format).
SUMS_FILE = "SHA256SUMS"
CENTRAL = "https://repo1.maven.org/maven2"
#: Substrings of a deploy task error (or node log) that mean DJL tried to download PyTorch.
DJL_DOWNLOAD_MARKERS = ("publish.djl.ai", "pytorch index file", "failed to download pytorch",
                        "no deep learning engine found")


class AirgapError(LsrError, ValueError):
    """An air-gap kit cannot be planned, fetched or installed (one sentence)."""


@dataclasses.dataclass(frozen=True)
class DjlNatives:
    """The PyTorch natives one ML Commons release line loads through DJL, and where they come from."""

    ml_commons: str  # the release tags this entry was read at
    djl: str
    pytorch: str
    flavor: str  # the cache folder's flavor, as ML Commons' settings make DJL compute it
    classifier: str
    native_jar: str  # Maven coordinates groupId:artifactId:version:packaging:classifier
    native_prefix: str  # folder of the libraries inside native_jar
    jni_jar: str
    jni_entry: str  # path of libdjl_torch.so inside jni_jar

    @property
    def folder(self) -> str:
        """The cache folder under ``<path.data>/ml_cache/pytorch/``."""
        return f"{self.pytorch}-{self.flavor}-{self.classifier}"

    @property
    def jni_name(self) -> str:
        """The JNI file name DJL looks for in that folder."""
        return f"{self.djl}-libdjl_torch.so"


_ML_COMMONS_3 = DjlNatives(
    ml_commons="3.0.0.0-3.8.0.0", djl="0.31.1", pytorch="2.5.1", flavor="cpu-precxx11", classifier="linux-x86_64",
    native_jar="ai.djl.pytorch:pytorch-native-cpu:2.5.1:jar:linux-x86_64",
    native_prefix="pytorch/cpu/linux-x86_64/",
    jni_jar="ai.djl.pytorch:pytorch-jni:2.5.1-0.32.0:jar",
    jni_entry="jnilib/linux-x86_64/cpu/libdjl_torch.so")


def natives_for(opensearch_version: str) -> DjlNatives:
    """The DJL natives an OpenSearch release's ML Commons loads (3.0 to 3.8: libtorch 2.5.1, DJL 0.31.1).

    Raises:
        AirgapError: a release line whose natives are not on Maven Central (2.x: libtorch 1.13.1
            with DJL 0.31.1, for which no ``pytorch-jni:1.13.1-0.31.1`` was published).
    """
    try:
        major, minor, _ = parse_version(opensearch_version)
    except ValueError as err:
        raise AirgapError(str(err)) from err
    if major == 3 and minor <= 8:
        return _ML_COMMONS_3
    if major == 2:
        raise AirgapError(
            f"OpenSearch {opensearch_version}: ML Commons 2.x loads libtorch 1.13.1 through DJL 0.28-0.31, and Maven "
            f"Central has no matching pytorch-jni (1.13.1-0.31.1); use OpenSearch 3.0+ or copy "
            f"<path.data>/ml_cache/pytorch from a node that once had internet access")
    raise AirgapError(f"OpenSearch {opensearch_version}: the DJL natives of this release were not read from "
                      f"ML Commons' source (known: 3.0 to 3.8)")


def _jar_url(coords: str) -> str:
    group, artifact, version, packaging, *rest = coords.split(":")
    classifier = f"-{rest[0]}" if rest else ""
    return f"{CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}{classifier}.{packaging}"


def _jar_name(coords: str) -> str:
    return _jar_url(coords).rsplit("/", 1)[1]


def kit_plan(opensearch_version: str, data_path: str = "<path.data>") -> dict[str, object]:
    """What an operator needs: the two Maven artifacts (URL), the target folder and the steps."""
    n = natives_for(opensearch_version)
    target = f"{data_path.rstrip('/')}/ml_cache/pytorch/{n.folder}"
    return {
        "opensearch_version": opensearch_version,
        "ml_commons": n.ml_commons, "djl": n.djl, "pytorch": n.pytorch,
        "artifacts": [{"coordinates": c, "url": _jar_url(c)} for c in (n.native_jar, n.jni_jar)],
        "target_folder": target,
        "files": {"from " + _jar_name(n.native_jar): f"{n.native_prefix}* -> {target}/",
                  "from " + _jar_name(n.jni_jar): f"{n.jni_entry} -> {target}/{n.jni_name}"},
        "per_node": ("on every node that runs models (ML nodes, or every data node when "
                     "plugins.ml_commons.only_run_on_ml_node is false), as the OpenSearch user, before the first "
                     "deploy; no restart needed"),
    }


def fetch_jars(opensearch_version: str, dest: str | os.PathLike, *, mvn: str = "mvn") -> list[Path]:
    """Download the two jars with Maven (``dependency:copy``, checksums checked by Maven) into ``dest``."""
    n = natives_for(opensearch_version)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which(mvn) is None:
        raise AirgapError(f"{mvn} is not installed: download {_jar_url(n.native_jar)} and {_jar_url(n.jni_jar)} "
                          f"by hand and pass their folder with --jars")
    out = []
    for coords in (n.native_jar, n.jni_jar):
        path = dest / _jar_name(coords)
        if not path.is_file():
            proc = subprocess.run([mvn, "-q", "-B", "dependency:copy", f"-Dartifact={coords}",
                                   f"-DoutputDirectory={dest}"], capture_output=True, text=True)
            if proc.returncode != 0 or not path.is_file():
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
                raise AirgapError(f"Maven could not fetch {coords}: {tail[0]}")
        out.append(path)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_kit(opensearch_version: str, jars_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Lay out ``OUT/ml_cache/pytorch/<folder>/`` from the two jars, with a ``SHA256SUMS`` file.

    Copy ``OUT/ml_cache`` into ``<path.data>`` of each ML node (e.g. ``rsync -a OUT/ml_cache/ <path.data>/ml_cache/``).

    Returns:
        The kit's library folder.
    """
    n = natives_for(opensearch_version)
    jars = Path(jars_dir)
    native, jni = jars / _jar_name(n.native_jar), jars / _jar_name(n.jni_jar)
    for jar in (native, jni):
        if not jar.is_file():
            raise AirgapError(f"{jar} is missing: fetch it first (lsr-os airgap-kit --fetch, or {_jar_url(n.native_jar)}"
                              f" / {_jar_url(n.jni_jar)})")
    folder = Path(out_dir) / "ml_cache" / "pytorch" / n.folder
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    with zipfile.ZipFile(native) as zf:
        for entry in zf.namelist():
            if entry.startswith(n.native_prefix) and not entry.endswith("/"):
                name = entry[len(n.native_prefix):]
                with zf.open(entry) as src, open(folder / name, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                names.append(name)
    if "libtorch.so" not in names:
        raise AirgapError(f"{native.name} holds no {n.native_prefix}libtorch.so")
    with zipfile.ZipFile(jni) as zf:
        if n.jni_entry not in zf.namelist():
            raise AirgapError(f"{jni.name} holds no {n.jni_entry}")
        (folder / n.jni_name).write_bytes(zf.read(n.jni_entry))
    names.append(n.jni_name)
    sums = "".join(f"{_sha256(folder / name)}  {name}\n" for name in sorted(names))
    (folder / SUMS_FILE).write_text(sums, encoding="utf-8")
    return folder


def check_cache(folder: str | os.PathLike) -> list[str]:
    """Problems of an installed (or built) cache folder against its ``SHA256SUMS`` ([] = intact)."""
    folder = Path(folder)
    sums = folder / SUMS_FILE
    if not sums.is_file():
        return [f"{sums} is missing"]
    problems = []
    for line in sums.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif _sha256(path) != digest:
            problems.append(f"{name} does not match its sha256")
    return problems


def install_kit(kit_folder: str | os.PathLike, data_path: str | os.PathLike, *, link: bool = False) -> Path:
    """Copy (or hard-link) a built kit folder into ``<data_path>/ml_cache/pytorch/`` and check it."""
    kit_folder = Path(kit_folder)
    problems = check_cache(kit_folder)
    if problems:
        raise AirgapError(f"the kit at {kit_folder} is damaged: {'; '.join(problems)}")
    target = Path(data_path) / "ml_cache" / "pytorch" / kit_folder.name
    target.mkdir(parents=True, exist_ok=True)
    for path in kit_folder.iterdir():
        dest = target / path.name
        if dest.exists():
            dest.unlink()
        if link:
            try:
                os.link(path, dest)
                continue
            except OSError:
                pass
        shutil.copy2(path, dest)
    return target
