"""Dataclass configs: every artifact directory carries the config that produced it.

Each capability defines its own dataclass config next to its code (``SemBridgeConfig`` in
``transfer/sembridge.py`` ...) and inherits :class:`ArtifactConfig` for saving/loading, so the
CLI and the library share one definition and every artifact is reproducible from its JSON.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ArtifactConfig", "write_json", "read_json", "sha256_file"]

T = TypeVar("T", bound="ArtifactConfig")


def write_json(path: str | os.PathLike, payload: Any) -> None:
    """Write JSON atomically (temp file + rename) so an interrupted job never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, ensure_ascii=False, indent=2, sort_keys=False, default=_json_default)
        fh.write("\n")
    os.replace(tmp, path)


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (artifact hashes, ML Commons model_content_hash_value)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@dataclasses.dataclass
class ArtifactConfig:
    """Base for configs saved as ``<dir>/<FILENAME>`` next to the artifact they describe."""

    FILENAME = "config.json"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
        """Save the config (plus optional run facts such as hashes and timings) into ``directory``."""
        payload = self.to_dict()
        if extra:
            payload.update(extra)
        path = Path(directory) / self.FILENAME
        write_json(path, payload)
        return path

    @classmethod
    def load(cls: type[T], directory: str | os.PathLike) -> T:
        """Load the config from ``directory``; keys that are run facts, not fields, are ignored."""
        data = read_json(Path(directory) / cls.FILENAME)
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{k: v for k, v in data.items() if k in names})
