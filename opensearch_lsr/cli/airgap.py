"""`lsr-os airgap-kit`: the PyTorch native cache an air-gapped ML Commons node needs before its first deploy."""
from __future__ import annotations

import click

from .app import cli, echo_json, fail, user_errors

__all__ = ["airgap_kit_cmd"]


@cli.command("airgap-kit")
@click.option("--opensearch-version", required=True, help="The cluster's OpenSearch version (e.g. 3.6.0).")
@click.option("--fetch", is_flag=True, help="Download the two DJL jars from Maven Central with mvn into --jars.")
@click.option("--jars", "jars_dir", type=click.Path(file_okay=False), default=None,
              help="Folder holding (or receiving, with --fetch) the two jars [default: OUT/jars].")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Build the kit here: OUT/ml_cache/pytorch/<folder>/ with the libraries and SHA256SUMS.")
@click.option("--install-to", "data_path", type=click.Path(file_okay=False), default=None,
              help="Also copy the kit into this node's path.data (run as the OpenSearch user on the ML node).")
@click.option("--check", "check_path", type=click.Path(file_okay=False), default=None,
              help="Only check an installed cache: this node's path.data, against the kit's SHA256SUMS.")
def airgap_kit_cmd(opensearch_version: str, fetch: bool, jars_dir: str | None, out_dir: str | None,
                   data_path: str | None, check_path: str | None) -> None:
    """Plan, build or check the DJL PyTorch cache ML Commons needs on nodes that cannot reach publish.djl.ai.

    \b
    Without --out: prints the Maven artifacts, the target folder on each ML node and the steps.
    With --out (and --fetch, or --jars holding the jars): lays out OUT/ml_cache/pytorch/<folder>/
    with SHA256SUMS; copy OUT/ml_cache/ into <path.data>/ml_cache/ on every ML node
    (e.g. rsync -a OUT/ml_cache/ <path.data>/ml_cache/), then deploy-model. Symptom it fixes:
    deploy-model fails with "publish.djl.ai" (opensearch-project/ml-commons#3670).
    """
    from pathlib import Path

    from ..opensearch import djl_cache

    with user_errors():
        plan = djl_cache.kit_plan(opensearch_version, data_path or check_path or "<path.data>")
        if check_path:
            folder = Path(plan["target_folder"])  # type: ignore[arg-type]
            problems = djl_cache.check_cache(folder)
            echo_json({**plan, "checked": str(folder), "problems": problems})
            if problems:
                fail(f"the PyTorch cache at {folder} is incomplete: {'; '.join(problems)}")
            return
        if not out_dir:
            if fetch or data_path:
                fail("--fetch and --install-to need --out (where the kit is built)")
            echo_json(plan)
            return
        jars = Path(jars_dir) if jars_dir else Path(out_dir) / "jars"
        if fetch:
            djl_cache.fetch_jars(opensearch_version, jars)
        folder = djl_cache.build_kit(opensearch_version, jars, out_dir)
        plan["kit_folder"] = str(folder)
        plan["sha256"] = dict(reversed(line.split("  ", 1)) for line in
                              (folder / djl_cache.SUMS_FILE).read_text(encoding="utf-8").splitlines())
        if data_path:
            plan["installed"] = str(djl_cache.install_kit(folder, data_path))
    echo_json(plan)
