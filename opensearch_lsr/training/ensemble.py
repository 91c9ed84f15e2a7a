"""Weight averaging of fine-tuned models of one architecture ("model soups", Wortsman et al. 2022, ICML).

Two runs fine-tuned from the same starting point (e.g. the corpus-adapted encoder and its labelled
continuation) often lie in one basin: the element-wise mean of their weights is a model as cheap as either,
frequently better than both. The soup is a plain copy of the first model with every ``*.safetensors``
tensor replaced by the weighted mean, so it loads, exports and deploys like any other encoder.
"""
from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ArtifactConfig, write_json

__all__ = ["SoupConfig", "average_models"]


@dataclass
class SoupConfig(ArtifactConfig):
    """What :func:`average_models` averaged; saved as ``soup_config.json`` next to the result."""

    FILENAME = "soup_config.json"

    models: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    out: str = ""


def average_models(models: Sequence[str | Path], out: str | Path, weights: Sequence[float] | None = None) -> Path:
    """Average ``models`` (SparseEncoder dirs with identical files and tensor shapes) into ``out``.

    Args:
        models: two or more model directories; the first gives every non-weight file (config, tokenizer,
            ``idf.json``).
        out: the new model directory (must not exist).
        weights: mixing weights (default: equal), normalised to sum 1.
    """
    from safetensors.torch import load_file, save_file

    paths = [Path(m) for m in models]
    if len(paths) < 2:
        raise ValueError("average at least two models")
    weights = list(weights) if weights is not None else [1.0] * len(paths)
    if len(weights) != len(paths) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"need one non-negative weight per model, got {weights}")
    total = sum(weights)
    weights = [w / total for w in weights]
    for path in paths:
        if not (path / "modules.json").is_file():
            raise ValueError(f"{path} is not a SparseEncoder directory (no modules.json)")
    skip = {"checkpoints", "adapt_work"}  # training leftovers, not the model
    files = sorted(p.relative_to(paths[0]) for p in paths[0].rglob("*.safetensors")
                   if not skip & set(p.relative_to(paths[0]).parts))
    if not files:
        raise ValueError(f"{paths[0]} holds no *.safetensors weights")
    target = Path(out)
    if target.exists():
        raise ValueError(f"{target} exists: choose a new directory")
    shutil.copytree(paths[0], target, ignore=shutil.ignore_patterns(*skip))
    for rel in files:
        tensors = [load_file(str(p / rel)) for p in paths if (p / rel).is_file()]
        if len(tensors) != len(paths):
            raise ValueError(f"{rel} is missing from some of the models: they are not one architecture")
        first = tensors[0]
        for other, path in zip(tensors[1:], paths[1:]):
            if other.keys() != first.keys() or any(other[k].shape != first[k].shape for k in first):
                raise ValueError(f"{path / rel} differs in tensor names or shapes from {paths[0] / rel}")
        mixed = {}
        for key, value in first.items():
            if value.is_floating_point():
                acc = sum(w * t[key].double() for w, t in zip(weights, tensors))
                mixed[key] = acc.to(value.dtype).contiguous()
            else:
                mixed[key] = value
        save_file(mixed, str(target / rel), metadata={"format": "pt"})
        if "SparseStaticEmbedding" in rel.parent.name and (target / "idf.json").exists():
            _rewrite_idf(target, rel.parent, mixed["weight"])
    SoupConfig(models=[str(p) for p in paths], weights=weights, out=str(target)).save(target)
    return target


def _rewrite_idf(target: Path, query_module: Path, weight) -> None:
    """``idf.json`` (what ``export`` ships as the query side) from the averaged query weights, so the
    exported model scores queries as the soup does (learned weights differ between the models)."""
    from ..contract import rust_tokenizer
    from ..inference_free import idf_from_weights

    write_json(target / "idf.json", idf_from_weights(rust_tokenizer(target / query_module), weight))
