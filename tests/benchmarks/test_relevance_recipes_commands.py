"""Every command of ``benchmarks/relevance_recipes.py`` (the Commands table of ``relevance_vs_nori.md``) parses
with today's ``lsr-os`` options, so each row stays reproducible as written."""
from __future__ import annotations

import importlib.util
import shlex
import sys
from argparse import Namespace
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def recipes():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("relevance_recipes", ROOT / "benchmarks" / "relevance_recipes.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses resolve their module while the file runs
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def _parse(argv: list[str]) -> None:
    from opensearch_lsr.cli import cli

    ctx = cli.make_context("lsr-os", list(argv))
    command = cli.get_command(ctx, argv[0])
    assert command is not None, f"no lsr-os command {argv[0]!r}"
    command.make_context(argv[0], argv[1:], parent=ctx)


def test_every_recipe_and_data_group_parses_with_the_cli(recipes, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.jsonl").write_text("")  # the commands check that the corpus exists
    args = Namespace(data=str(tmp_path / "data"), work=str(tmp_path / "work"), sembridge=str(tmp_path / "start"),
                     dense=str(tmp_path / "dense"))
    names = [r.name for r in recipes.RECIPES]
    assert len(names) == len(set(names))
    built = [r.name for r in recipes.build_order(recipes.RECIPES)]
    assert sorted(built) == sorted(names)
    parsed = 0
    for recipe in recipes.RECIPES:
        assert recipe.group is None or recipe.group in recipes.GROUPS, recipe.name
        assert all(built.index(need) < built.index(recipe.name) for need in recipe.needs), recipe.name
        argv = shlex.split(recipes._fill(recipe.args, args, recipe))
        if argv[0] != "sum":  # summed vectors are built by the script, not by one lsr-os command
            _parse(argv)
            parsed += 1
        else:  # the models a sum reads are the ones it waits for
            assert [Path(a).name for a in argv[1:]] == recipe.needs, recipe.name
    for command in recipes.GROUPS.values():
        _parse(shlex.split(recipes._fill(command, args)))
    assert parsed == sum(not r.args.startswith("sum ") for r in recipes.RECIPES) > len(names) // 2
    with pytest.raises(click.UsageError, match="no-such-flag"):
        _parse(["adapt", "--model", "m", "--no-such-flag"])
