"""One error root: every error class the package defines derives from ``LsrError``, and the CLI prints
such an error as one line, never a traceback."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

from click.testing import CliRunner

import opensearch_lsr
from opensearch_lsr.errors import LsrError


def test_every_error_class_derives_from_lsr_error():
    found = {}
    for info in pkgutil.walk_packages(opensearch_lsr.__path__, "opensearch_lsr."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == info.name and issubclass(obj, Exception):
                found[f"{info.name}.{name}"] = obj
    assert len(found) >= 11
    strays = sorted(name for name, cls in found.items() if not issubclass(cls, LsrError))
    assert not strays, f"error classes outside the LsrError root: {strays}"


def test_cli_prints_a_library_error_as_one_line(tmp_path):
    from opensearch_lsr.cli import cli

    result = CliRunner().invoke(cli, ["search", "--index", str(tmp_path / "missing"), "서울"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: no such index [missing]") and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
