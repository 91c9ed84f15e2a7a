"""GPU ML nodes (issue 13 item 7): the exported trace pins CPU, and every user-facing surface says so.

No GPU is lent to this task, so the trace is not made device-agnostic (that could not be proven);
instead the limit is stated in the manifest (``ml_node_devices``), ``export --help``, ``deploy-model
--help`` and the deploy error hint.
This test keeps those statements tied to the graph: if a future trace drops its device constants,
it fails and the statements must be revisited.
"""
from __future__ import annotations

import io
import zipfile

import torch
from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.opensearch.mlcommons import deploy_hint


def _device_constants(zip_path) -> list[str]:
    with zipfile.ZipFile(zip_path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".pt"))
        module = torch.jit.load(io.BytesIO(zf.read(name)), map_location="cpu")
    return [n.output().toIValue().type for n in module.inlined_graph.nodes()
            if n.kind() == "prim::Constant" and n.output().type().kind() == "DeviceObjType"]


def test_cpu_pinned_trace_is_stated_everywhere(tmp_path, tiny_source_dir):
    from opensearch_lsr.opensearch.artifacts import export_bundle

    manifest = export_bundle(str(tiny_source_dir), tmp_path / "bundle", verify=False)
    devices = _device_constants(tmp_path / "bundle" / "sparse_encoding.zip")
    assert devices == ["cpu"]  # transformers' mask construction records torch.device("cpu")
    assert manifest["ml_node_devices"] == ["cpu"] and manifest["torchscript"]["devices"] == ["cpu"]
    runner = CliRunner()
    assert "CPU ML nodes" in runner.invoke(cli, ["export", "--help"]).output
    assert "CPU ML nodes only" in runner.invoke(cli, ["deploy-model", "--help"]).output
    hint = deploy_hint('{"node": "Failed to deploy model abc"}')
    assert "CPU ML node" in hint and "GPU" in hint
