"""GPU ML nodes: the exported graph holds no device constant.

DJL loads one predictor per device of an ML node and warms each up (ml-commons ``DLModel``), so a
TorchScript graph with ``torch.device("cpu")`` constants (what transformers' mask utilities record
when handed a 2-D mask) fails on a GPU node. The export now builds the additive attention mask in
the graph from the input. No GPU is lent to this task, so the GPU run itself is NOT proven here:
the test checks the graph (no device constants, same outputs as the 2-D-mask wrapper) and that
manifest, help and deploy hint say what is and is not known.
"""
from __future__ import annotations

import io
import zipfile

import torch
from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.opensearch.mlcommons import deploy_hint


def _device_constants(graph) -> list[str]:
    return [str(n.output().toIValue()) for n in graph.nodes()
            if n.kind() == "prim::Constant" and n.output().type().kind() == "DeviceObjType"]


def _load(zip_path):
    with zipfile.ZipFile(zip_path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".pt"))
        return torch.jit.load(io.BytesIO(zf.read(name)), map_location="cpu")


def test_exported_graph_has_no_device_constant(tmp_path, tiny_source_dir):
    from opensearch_lsr.opensearch.artifacts import export_bundle

    manifest = export_bundle(str(tiny_source_dir), tmp_path / "bundle", verify=False)
    module = _load(tmp_path / "bundle" / "sparse_encoding.zip")
    assert _device_constants(module.inlined_graph) == []
    assert manifest["torchscript"]["devices"] == [] and manifest["ml_node_devices"] == ["any"]
    runner = CliRunner()
    assert "no device constant" in runner.invoke(cli, ["export", "--help"]).output
    assert '"ml_node_devices": ["cpu"]' in runner.invoke(cli, ["deploy-model", "--help"]).output
    hint = deploy_hint('{"node": "Failed to deploy model abc"}')
    assert "ml_node_devices" in hint and "re-export" in hint


def test_the_two_dimensional_mask_would_pin_cpu(tiny_source_dir):
    """The wrapper before the fix (2-D mask to transformers) records a CPU device; the fixed one does
    not, and both give the same weights."""
    import copy

    from opensearch_lsr.opensearch.trace import SparseEncodingModule
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    encoder = load_sparse_encoder(str(tiny_source_dir))
    mlm = copy.deepcopy(encoder[0].auto_model).float().eval()
    mlm.set_attn_implementation("eager")
    vocab = mlm.config.vocab_size

    class TwoD(SparseEncodingModule):
        def forward(self, input):  # noqa: A002 - DJL's name
            logits = self.mlm(input_ids=input["input_ids"], attention_mask=input["attention_mask"],
                              return_dict=False)[0]
            values = torch.log1p(torch.relu(logits * input["attention_mask"].unsqueeze(-1).to(logits.dtype)))
            return {"output": (torch.max(values, dim=1)[0] * self.keep).to(torch.float32)}

    batch = encoder.tokenizer(["alpha beta gamma", "delta"], padding=True, return_tensors="pt",
                              return_token_type_ids=False)
    example = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        old = torch.jit.trace(TwoD(mlm, vocab, []).eval(), (example,), strict=False, check_trace=False)
        new = torch.jit.trace(SparseEncodingModule(mlm, vocab, []).eval(), (example,), strict=False, check_trace=False)
        assert _device_constants(old.inlined_graph) == ["cpu"]
        assert _device_constants(new.inlined_graph) == []
        torch.testing.assert_close(old(example)["output"], new(example)["output"], rtol=0, atol=1e-6)
