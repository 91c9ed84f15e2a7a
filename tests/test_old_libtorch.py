"""The exported TorchScript loads and computes the same vectors in the oldest libtorch the engines ship.

torch 2.5.1 is the libtorch of OpenSearch ML Commons (DJL 0.31.1's PyTorch engine) and of Elasticsearch 9.0-9.1
(ml-cpp). Its PyPI wheel is CUDA-linked (about 5 GB with its nvidia packages), so the test is ``slow`` and runs
the check in a separate, cached virtual environment: ``$LSR_OLD_TORCH_PYTHON`` (a python with torch 2.5.1), else
``~/.cache/opensearch-lsr/torch-2.5.1``, created on first use with ``pip install torch==2.5.1``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

OLD_TORCH = "2.5.1"
TEXTS = ["what is the capital of france", "서울은 한국의 수도입니다", "a longer passage about the river and its bridges " * 4]

_RUNNER = r"""
import json, sys, torch
spec = json.load(open(sys.argv[1]))
out = {"torch": torch.__version__, "results": {}}
for name, job in spec.items():
    module = torch.jit.load(job["path"], map_location="cpu").eval()
    rows = []
    with torch.no_grad():
        for ids, mask in zip(job["ids"], job["masks"]):
            i = torch.tensor([ids], dtype=torch.int64)
            m = torch.tensor([mask], dtype=torch.int64)
            if job["call"] == "dict":  # ML Commons (DJL): one dict of input_ids + attention_mask
                res = module({"input_ids": i, "attention_mask": m})
                res = list(res.values())[0] if isinstance(res, dict) else res
            else:  # ml-cpp: four positional int64 tensors
                res = module(i, m, torch.zeros_like(i), torch.arange(i.shape[1]).unsqueeze(0))
            rows.append(res[0].float().tolist())
    out["results"][name] = rows
json.dump(out, open(sys.argv[2], "w"))
"""


def _old_python() -> Path:
    given = os.environ.get("LSR_OLD_TORCH_PYTHON")
    if given:
        return Path(given)
    venv = Path.home() / ".cache" / "opensearch-lsr" / f"torch-{OLD_TORCH}"
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import torch; print(torch.__version__)"] if python.exists() else None
    if probe is None or subprocess.run(probe, capture_output=True, text=True).stdout.strip() != OLD_TORCH:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        res = subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={OLD_TORCH}"], capture_output=True,
                             text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot install torch {OLD_TORCH} into {venv}: {res.stderr.strip()[-300:]}")
    return python


def test_exports_run_identically_in_torch_2_5_1(tmp_path, splade_tiny_dir):
    import numpy as np
    import torch

    from opensearch_lsr.elasticsearch.export import export_elasticsearch
    from opensearch_lsr.elasticsearch.tokenizer import EsBertTokenizer
    from opensearch_lsr.opensearch.artifacts import export_bundle

    torch.set_num_threads(1)
    python = _old_python()
    os_dir, es_dir = tmp_path / "os", tmp_path / "es"
    export_bundle(str(splade_tiny_dir), os_dir, verify=False)
    export_elasticsearch(str(splade_tiny_dir), es_dir, verify=False)
    with zipfile.ZipFile(os_dir / "sparse_encoding.zip") as zf:
        pt = next(n for n in zf.namelist() if n.endswith(".pt"))
        zf.extract(pt, tmp_path / "os_pt")
        tok = json.loads(zf.read(next(n for n in zf.namelist() if n.endswith("tokenizer.json"))))
    from tokenizers import Tokenizer

    djl = Tokenizer.from_str(json.dumps(tok))
    os_enc = [djl.encode(t) for t in TEXTS]
    es_vocab = json.loads((es_dir / "elasticsearch" / "vocabulary.json").read_text())["vocabulary"]
    es_cfg = json.loads((es_dir / "elasticsearch" / "config.json").read_text())["inference_config"]
    es_tok = EsBertTokenizer.from_config(es_vocab, es_cfg)
    es_req = [es_tok.request([t]) for t in TEXTS]
    spec = {
        "opensearch": {"path": str(tmp_path / "os_pt" / pt), "call": "dict", "ids": [e.ids for e in os_enc],
                       "masks": [e.attention_mask for e in os_enc]},
        "elasticsearch": {"path": str(es_dir / "elasticsearch" / "traced_pytorch_model.pt"), "call": "positional",
                          "ids": [r["tokens"][0] for r in es_req], "masks": [r["arg_1"][0] for r in es_req]},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "run.py").write_text(_RUNNER)
    res = subprocess.run([str(python), str(tmp_path / "run.py"), str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    old = json.loads((tmp_path / "out.json").read_text())
    assert old["torch"].startswith(OLD_TORCH)
    # the same modules in this process' torch
    (tmp_path / "now.py").write_text(_RUNNER)
    subprocess.run([sys.executable, str(tmp_path / "now.py"), str(tmp_path / "spec.json"), str(tmp_path / "now.json")],
                   check=True, timeout=600)
    now = json.loads((tmp_path / "now.json").read_text())
    for name in spec:
        a, b = np.asarray(old["results"][name]), np.asarray(now["results"][name])
        assert a.shape == b.shape == (len(TEXTS), len(es_vocab))
        assert np.abs(a - b).max() < 1e-5, name
        assert (a > 0).sum() > 0
