"""What the benchmark-script tests share: a script of ``benchmarks/`` loaded as a module."""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def load_script() -> Callable[[str], ModuleType]:
    """``load_script("gpu_encode")``: ``benchmarks/gpu_encode.py`` as a module (it puts its folder on
    ``sys.path`` itself, as when run)."""
    return _load
