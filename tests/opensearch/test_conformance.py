"""The ML Commons re-implementation itself: zip rules, output contract, key mapping, SPARSE_TOKENIZE."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opensearch_lsr.opensearch.conformance import (  # noqa: E402
    ConformanceError,
    MLCommonsRuntime,
    check_zip_layout,
    vector_to_map,
    verify_bundle,
)


@pytest.fixture(scope="module")
def tokenizer_json(tiny_source_dir) -> bytes:
    return (Path(tiny_source_dir) / "tokenizer.json").read_bytes()


@pytest.fixture(scope="module")
def vocab_size(tokenizer_json) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json.decode()).get_vocab_size(with_added_tokens=True)


def _script(kind: str, vocab: int):
    """Small scripted models obeying (ok) or breaking one rule of the ML Commons output contract."""
    from typing import Dict

    class Ok(torch.nn.Module):
        def __init__(self, v: int):
            super().__init__()
            self.v = v

        def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
            ids = input["input_ids"]
            out = torch.zeros(ids.shape[0], self.v)
            out.scatter_(1, ids, 0.5)  # weight 0.5 on every input id, specials included
            return {"output": out}

    class TwoOutputs(Ok):
        def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
            out = torch.zeros(input["input_ids"].shape[0], self.v)
            return {"output": out, "extra": out}

    class WrongShape(Ok):
        def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
            return {"output": torch.zeros(input["input_ids"].shape[0], self.v + 1)}

    class Negative(Ok):
        def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
            return {"output": -torch.ones(input["input_ids"].shape[0], self.v)}

    class IntOut(Ok):
        def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
            return {"output": torch.ones(input["input_ids"].shape[0], self.v, dtype=torch.int64)}

    class NeedsTokenTypes(Ok):
        def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
            tt = input["token_type_ids"]  # DJL never sends it
            return {"output": torch.zeros(tt.shape[0], self.v)}

    cls = {"ok": Ok, "two": TwoOutputs, "shape": WrongShape, "negative": Negative, "int": IntOut,
           "token_types": NeedsTokenTypes}[kind]
    return torch.jit.script(cls(vocab))


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _pt_bytes(module, tmp_path: Path) -> bytes:
    p = tmp_path / "m.pt"
    torch.jit.save(module, str(p))
    return p.read_bytes()


# --------------------------------------------------------------------------- layout rules


def test_zip_layout_rules(tmp_path, tokenizer_json):
    pt = b"not really torchscript"
    cases = {
        "ok": ({"model.pt": pt, "tokenizer.json": tokenizer_json, "LICENSE": b"x"}, []),
        "nested_tok": ({"model.pt": pt, "sub/tokenizer.json": tokenizer_json}, ["No tokenizer file"]),
        "two_models": ({"a.pt": pt, "b.pt": pt, "tokenizer.json": tokenizer_json}, ["multiple model files"]),
        "nested_model": ({"sub/a.pt": pt, "tokenizer.json": tokenizer_json}, ["zip root"]),
        "no_model": ({"tokenizer.json": tokenizer_json}, ["Can't find model file"]),
        "onnx": ({"a.onnx": pt, "tokenizer.json": tokenizer_json}, [".onnx"]),
        "native": ({"a.pt": pt, "tokenizer.json": tokenizer_json, "lib/x.so": b"\x7fELF"}, ["native code"]),
        "serving": ({"a.pt": pt, "tokenizer.json": tokenizer_json,
                     "serving.properties": b"translatorFactory=com.evil.Factory\n"}, ["non-ai.djl class"]),
    }
    for name, (members, expected) in cases.items():
        problems = check_zip_layout(_zip(tmp_path / f"{name}.zip", members), "SPARSE_ENCODING")
        assert len(problems) == len(expected), (name, problems)
        for fragment, problem in zip(expected, problems):
            assert fragment in problem, (name, problem)
    # a tokenizer model needs no model file
    assert check_zip_layout(_zip(tmp_path / "tok.zip", {"tokenizer.json": tokenizer_json}), "sparse_tokenize") == []
    assert "not a readable zip" in check_zip_layout(_zip(tmp_path / "x.zip", {})  # empty but valid
                                                     .with_name("missing.zip"), "SPARSE_ENCODING")[0]
    with pytest.raises(ValueError, match="function_name"):
        check_zip_layout(tmp_path / "ok.zip", "TEXT_EMBEDDING")


def test_from_zip_refuses_bad_layout_and_bad_torchscript(tmp_path, tokenizer_json):
    with pytest.raises(ConformanceError, match="does not exist"):
        MLCommonsRuntime.from_zip(tmp_path / "missing.zip")
    bad = _zip(tmp_path / "bad.zip", {"sub/model.pt": b"x", "tokenizer.json": tokenizer_json})
    with pytest.raises(ConformanceError, match="would not deploy"):
        MLCommonsRuntime.from_zip(bad)
    garbage = _zip(tmp_path / "garbage.zip", {"model.pt": b"garbage", "tokenizer.json": tokenizer_json})
    with pytest.raises(ConformanceError, match="not loadable TorchScript"):
        MLCommonsRuntime.from_zip(garbage)
    badtok = _zip(tmp_path / "badtok.zip", {"tokenizer.json": b"{not json"})
    with pytest.raises(ConformanceError, match="tokenizer.json"):
        MLCommonsRuntime.from_zip(badtok, "SPARSE_TOKENIZE")


# --------------------------------------------------------------------------- output contract


@pytest.mark.parametrize("kind,message", [
    ("two", "exactly one tensor"),
    ("shape", "is not \\[1,"),
    ("negative", "negative"),
    ("int", "float32/float16"),
    ("token_types", "failed"),
])
def test_output_contract_violations(kind, message, tmp_path, tokenizer_json, vocab_size):
    z = _zip(tmp_path / f"{kind}.zip", {"m.pt": _pt_bytes(_script(kind, vocab_size), tmp_path),
                                        "tokenizer.json": tokenizer_json})
    rt = MLCommonsRuntime.from_zip(z)
    with pytest.raises(ConformanceError, match=message):
        rt.predict(["the cat"])


def test_predict_word_and_token_id_keys(tmp_path, tokenizer_json, vocab_size):
    z = _zip(tmp_path / "ok.zip", {"m.pt": _pt_bytes(_script("ok", vocab_size), tmp_path),
                                   "tokenizer.json": tokenizer_json})
    rt = MLCommonsRuntime.from_zip(z, "sparse_encoding")  # function names are case-insensitive
    ids = rt.encode_ids("the dogs")
    assert ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP]: special tokens are added
    (word,) = rt.predict(["the dogs"])
    assert word == {"the": 0.5, "dog": 0.5, "##s": 0.5}  # specials decode to "" and are dropped
    (tid,) = rt.predict(["the dogs"], embedding_format="TOKEN_ID")
    assert tid == {str(i): 0.5 for i in ids}  # no decode under TOKEN_ID: specials stay
    assert rt.predict([]) == []
    with pytest.raises(ValueError, match="embedding_format"):
        rt.predict(["x"], embedding_format="lexical")
    with pytest.raises(TypeError):
        rt.predict("the cats")  # type: ignore[arg-type]


def test_truncation_cap(tmp_path, tokenizer_json):
    spec = json.loads(tokenizer_json)
    text = " ".join(["cat"] * 2000)
    for block, expected in [(None, 512), ({"direction": "Right", "max_length": 4096, "strategy": "LongestFirst",
                                           "stride": 0}, 512),
                            ({"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}, 16)]:
        spec["truncation"] = block
        z = _zip(tmp_path / "t.zip", {"tokenizer.json": json.dumps(spec).encode()})
        rt = MLCommonsRuntime.from_zip(z, "SPARSE_TOKENIZE")
        assert rt.max_length == expected and len(rt.encode_ids(text)) == expected


def test_vector_to_map_semantics():
    table = ["", "a", "b", "a", ""]
    vec = np.array([3.0, 1.0, 0.0, 2.0, -1.0], dtype=np.float32)
    assert vector_to_map(vec, table) == {"a": 2.0}  # "" dropped, zero dropped, later "a" overwrites
    assert vector_to_map(vec, table, "token_id") == {"0": 3.0, "1": 1.0, "3": 2.0, "4": -1.0}


# --------------------------------------------------------------------------- SPARSE_TOKENIZE


def test_sparse_tokenize_distinct_ids_idf_and_default(tmp_path, tokenizer_json):
    idf = {"cat": 2.5, "the": 0.1, "[CLS]": 99.0}
    z = _zip(tmp_path / "tok.zip", {"tokenizer.json": tokenizer_json, "idf.json": json.dumps(idf).encode()})
    rt = MLCommonsRuntime.from_zip(z, "SPARSE_TOKENIZE")
    (w,) = rt.predict(["the cat the dogs dog"])
    assert w == {"the": pytest.approx(0.1), "cat": 2.5, "##s": 1.0, "dog": 1.0}  # distinct, default 1.0
    (t,) = rt.predict(["the cat"], embedding_format="token_id")
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    # the key is the id but the lookup still uses the decoded token (SparseTokenizerModel)
    assert t == {str(vocab["the"]): pytest.approx(0.1), str(vocab["cat"]): 2.5}
    no_idf = MLCommonsRuntime.from_zip(_zip(tmp_path / "t2.zip", {"tokenizer.json": tokenizer_json}), "SPARSE_TOKENIZE")
    assert set(no_idf.predict(["the cat"])[0].values()) == {1.0}
    bad = _zip(tmp_path / "t3.zip", {"tokenizer.json": tokenizer_json, "idf.json": b'["x"]'})
    with pytest.raises(ConformanceError, match="idf.json"):
        MLCommonsRuntime.from_zip(bad, "SPARSE_TOKENIZE")
    with pytest.raises(ConformanceError, match="no TorchScript"):
        rt.raw_output("the cat")


def test_verify_bundle_needs_a_manifest(tmp_path, tiny_source_dir):
    with pytest.raises(ConformanceError, match="manifest.json"):
        verify_bundle(tmp_path, tiny_source_dir, ["x"])


def test_verify_bundle_detects_a_wrong_model(tmp_path, tiny_source_dir, tokenizer_json, vocab_size):
    """A bundle whose TorchScript is not the model must fail verification (the check can fail)."""
    from opensearch_lsr.config import write_json

    enc = _zip(tmp_path / "sparse_encoding.zip", {"m.pt": _pt_bytes(_script("ok", vocab_size), tmp_path),
                                                 "tokenizer.json": tokenizer_json})
    _zip(tmp_path / "sparse_tokenize.zip", {"tokenizer.json": tokenizer_json})
    write_json(tmp_path / "manifest.json", {"key_format": "word", "sparse_encoding": {"file": enc.name},
                                            "sparse_tokenize": {"file": "sparse_tokenize.zip"}})
    report = verify_bundle(tmp_path, tiny_source_dir, ["the cat is in the house"])
    assert not report["passed"] and (report["key_mismatches_above_atol"] > 0 or report["max_abs_weight_diff"] > 1e-4)
