"""Run an exported sparse model zip exactly the way OpenSearch ML Commons does.

ML Commons (DJL) cannot run here, so this module re-implements what it does with a deployed
``SPARSE_ENCODING`` / ``SPARSE_TOKENIZE`` zip (``opensearch-contract.md`` sections 1.5, 2.1, 2.2, 8):

* the zip root must hold ``tokenizer.json`` and (for SPARSE_ENCODING) exactly one ``.pt``;
  sub-folders are not scanned; ML Commons 3.8+ also refuses native code and class files;
* tokenization is HF ``tokenizers`` on that ``tokenizer.json`` with special tokens added and
  truncation to ``min(tokenizer.json truncation.max_length or 512, 512)`` (DJL >= 0.28);
* the TorchScript is called once per document (no batching) with ONE dict argument holding
  ``input_ids`` and ``attention_mask`` (int64, ``[1, seq]``) and nothing else;
* it must return exactly one float32/float16 tensor of shape ``[1, V]``, ``V`` = tokenizer size;
* nonzero ids become keys: ``decode([id], skip_special_tokens=True)`` with ``""`` dropped and later
  duplicates overwriting earlier ones (WORD), or ``str(id)`` (TOKEN_ID, OpenSearch 3.2+);
* SPARSE_TOKENIZE: distinct ids, single-id decode, ``idf.getOrDefault(token, 1.0)``; under
  TOKEN_ID the key is the id but the IDF lookup still uses the decoded token.

It is hand-written because no Python package emulates DJL's ML Commons translators. Users: the
OpenSearch bundle check (:mod:`opensearch_lsr.opensearch.conformance`), the local engine (a ``model_id``
that is a zip path) and the HTTP test double, which executes deployed models through :class:`MLCommonsRuntime`.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from ..contract import decode_keys, djl_tokenizer, vector_to_keys
from ..errors import LsrError

__all__ = [
    "ConformanceError",
    "MLCommonsRuntime",
    "FUNCTION_NAMES",
    "EMBEDDING_FORMATS",
    "FORBIDDEN_SUFFIXES",
    "check_zip_layout",
    "vector_to_map",
]

logger = logging.getLogger(__name__)

FunctionName = Literal["SPARSE_ENCODING", "SPARSE_TOKENIZE"]
EmbeddingFormat = Literal["word", "token_id"]
FUNCTION_NAMES: tuple[str, ...] = ("SPARSE_ENCODING", "SPARSE_TOKENIZE")
EMBEDDING_FORMATS: tuple[str, ...] = ("word", "token_id")
#: Entries ML Commons 3.8+ refuses inside a model archive (``verifyModelDirSafety``).
FORBIDDEN_SUFFIXES: tuple[str, ...] = (".jar", ".class", ".so", ".dylib", ".dll")
MODEL_SUFFIXES: tuple[str, ...] = (".pt", ".onnx")


class ConformanceError(LsrError, ValueError):
    """The artifact would fail, or behave differently, inside ML Commons: one clear sentence."""


def _normalise_function_name(function_name: str) -> str:
    name = str(function_name).upper()  # FunctionName.from upper-cases (case-insensitive)
    if name not in FUNCTION_NAMES:
        raise ValueError(f"function_name must be one of {', '.join(FUNCTION_NAMES)}, got {function_name!r}")
    return name


def _normalise_format(embedding_format: str) -> str:
    fmt = str(embedding_format).lower()  # SparseEmbeddingFormat is parsed case-insensitively
    if fmt not in EMBEDDING_FORMATS:
        raise ValueError(f"embedding_format must be one of {', '.join(EMBEDDING_FORMATS)}, got {embedding_format!r}")
    return fmt


def check_zip_layout(zip_path: str | os.PathLike, function_name: str = "SPARSE_ENCODING") -> list[str]:
    """Return the problems ML Commons would report for this zip (empty list: the layout is valid).

    Rules (contract 1.5, 2.1, 6.8): a root-level ``tokenizer.json``; exactly one ``.pt``/``.onnx``
    entry, at the root (required for SPARSE_ENCODING, none needed for SPARSE_TOKENIZE); no
    ``.jar/.class/.so/.dylib/.dll`` entries; no ``serving.properties`` naming a non-DJL class.
    """
    function_name = _normalise_function_name(function_name)
    problems: list[str] = []
    try:
        with zipfile.ZipFile(zip_path) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            serving = [n for n in names if n.split("/")[-1] == "serving.properties"]
            serving_text = {n: zf.read(n).decode("utf-8", "replace") for n in serving}
    except (OSError, zipfile.BadZipFile) as err:
        return [f"{zip_path} is not a readable zip file ({err})"]
    if "tokenizer.json" not in names:
        problems.append("No tokenizer file: the zip root has no tokenizer.json")
    models = [n for n in names if n.lower().endswith(MODEL_SUFFIXES)]
    if len(models) > 1:
        problems.append(f"Find multiple model files, but expected only one: {models}")
    nested = [n for n in models if "/" in n]
    if nested:
        problems.append(f"model files must sit at the zip root (sub-folders are not scanned): {nested}")
    if function_name == "SPARSE_ENCODING":
        if not models:
            problems.append("Can't find model file: a SPARSE_ENCODING zip needs one TorchScript .pt at its root")
        elif any(m.lower().endswith(".onnx") for m in models):
            problems.append("Model format is TORCH_SCRIPT, but find .onnx file")
    forbidden = [n for n in names if n.lower().endswith(FORBIDDEN_SUFFIXES)]
    if forbidden:
        problems.append(f"archive holds native code or class files that ML Commons 3.8+ refuses: {forbidden}")
    for name, text in serving_text.items():
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() in {"translatorFactory", "translator"} and not value.strip().startswith("ai.djl."):
                problems.append(f"{name} points at a non-ai.djl class ({value.strip()}), refused by ML Commons 3.8+")
    return problems


def vector_to_map(
    vector: np.ndarray, decode_table: Sequence[str], embedding_format: str = "word"
) -> dict[str, float]:
    """ML Commons ``SparseEncodingTranslator``: nonzero ids -> ``{key: weight}``.

    Exact zeros are dropped, negatives kept; WORD keys are the single-id decode with ``""``
    skipped and later duplicates overwriting earlier ones; TOKEN_ID keys are ``str(id)``.
    """
    fmt = _normalise_format(embedding_format)
    vector = np.asarray(vector).reshape(-1)
    nonzero = np.flatnonzero(vector)
    return vector_to_keys(nonzero.tolist(), vector[nonzero].tolist(), decode_table if fmt == "word" else None)


@dataclass
class MLCommonsRuntime:
    """An ML Commons local sparse model, loaded from its zip like ``DLModel.loadModel`` does.

    Build it with :meth:`from_zip`; call :meth:`predict` with the ``text_docs`` of a
    ``_predict`` request. One document at a time, as ``TextEmbeddingModel.predict`` does.
    """

    function_name: str
    tokenizer: Any  # tokenizers.Tokenizer
    max_length: int
    module: Any = None  # torch.jit.ScriptModule for SPARSE_ENCODING
    idf: dict[str, float] = field(default_factory=dict)
    zip_path: str | None = None
    #: expected output width when it is not the tokenizer size (MILCO: V_src + V_en; TOKEN_ID keys never decode)
    output_dim: int | None = None
    _decode: list[str] | None = field(default=None, repr=False)

    @classmethod
    def from_zip(cls, zip_path: str | os.PathLike, function_name: str = "SPARSE_ENCODING") -> "MLCommonsRuntime":
        """Unzip, check the layout, load ``tokenizer.json`` (+ the ``.pt`` or ``idf.json``).

        Raises:
            ConformanceError: the zip would not deploy (layout, tokenizer or TorchScript load).
        """
        function_name = _normalise_function_name(function_name)
        zip_path = Path(zip_path)
        if not zip_path.is_file():
            raise ConformanceError(f"model zip {str(zip_path)!r} does not exist")
        problems = check_zip_layout(zip_path, function_name)
        if problems:
            raise ConformanceError(f"{zip_path.name} would not deploy as {function_name}: " + "; ".join(problems))
        workdir = Path(tempfile.mkdtemp(prefix="mlc_runtime_"))
        try:
            with zipfile.ZipFile(zip_path) as zf:
                zf.extractall(workdir)
            tokenizer, max_length = cls._load_tokenizer(workdir / "tokenizer.json")
            module = None
            idf: dict[str, float] = {}
            if function_name == "SPARSE_ENCODING":
                pt = next(p for p in workdir.iterdir() if p.suffix.lower() == ".pt")
                module = cls._load_torchscript(pt)
            elif (workdir / "idf.json").exists():
                idf = cls._load_idf(workdir / "idf.json")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return cls(function_name, tokenizer, max_length, module=module, idf=idf, zip_path=str(zip_path))

    @staticmethod
    def _load_tokenizer(path: Path):
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 - DJL would fail to build its HuggingFaceTokenizer too
            raise ConformanceError(f"tokenizer.json cannot be loaded by HF tokenizers: {err}") from err
        # DJL >= 0.28: LONGEST_FIRST, max_length from tokenizer.json (else 512), capped at 512; padding is
        # on in DJL, but a single sequence is never padded
        tokenizer = djl_tokenizer(tokenizer)
        return tokenizer, int(tokenizer.truncation["max_length"])

    @staticmethod
    def _load_torchscript(path: Path):
        import torch

        try:
            module = torch.jit.load(str(path), map_location="cpu")
        except Exception as err:  # noqa: BLE001 - ML Commons: "Failed to deploy model <id>"
            raise ConformanceError(f"{path.name} is not loadable TorchScript: {err}") from err
        module.eval()
        return module

    @staticmethod
    def _load_idf(path: Path) -> dict[str, float]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ConformanceError(f"idf.json is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise ConformanceError("idf.json must be a JSON object {token: weight}")
        try:
            # Gson Map<String, Float>: float32 values
            return {str(k): float(np.float32(v)) for k, v in data.items()}
        except (TypeError, ValueError) as err:
            raise ConformanceError(f"idf.json holds a non-numeric weight: {err}") from err

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def decode_table(self) -> list[str]:
        if self._decode is None:
            self._decode = decode_keys(self.tokenizer)
        return self._decode

    def encode_ids(self, text: str) -> list[int]:
        """DJL ``HuggingFaceTokenizer.encode(text)``: special tokens added, truncated."""
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def raw_output(self, text: str) -> np.ndarray:
        """Run the TorchScript on one document and check the output contract; returns ``[V]``."""
        import torch

        if self.module is None:
            raise ConformanceError("a SPARSE_TOKENIZE model has no TorchScript to run")
        enc = self.tokenizer.encode(text, add_special_tokens=True)
        inputs = {
            "input_ids": torch.tensor([enc.ids], dtype=torch.int64),
            "attention_mask": torch.tensor([enc.attention_mask], dtype=torch.int64),
        }
        with torch.no_grad():
            try:
                result = self.module(inputs)
            except Exception as err:  # noqa: BLE001
                raise ConformanceError(f"the TorchScript failed on a {len(enc.ids)}-token input: {err}") from err
        tensors = list(result.values()) if isinstance(result, dict) else (
            list(result) if isinstance(result, (list, tuple)) else [result]
        )
        if len(tensors) != 1 or not isinstance(tensors[0], torch.Tensor):
            raise ConformanceError(f"the model must return exactly one tensor, got {len(tensors)} outputs")
        out = tensors[0]
        if out.dtype not in (torch.float32, torch.float16):
            raise ConformanceError(f"output dtype {out.dtype} is not float32/float16 (DJL: DataType mismatch)")
        width = self.output_dim or self.vocab_size
        if tuple(out.shape) != (1, width):
            raise ConformanceError(
                f"output shape {tuple(out.shape)} is not [1, {width}] (batch 1, "
                f"{'the manifest output_dim' if self.output_dim else 'tokenizer vocabulary'})"
            )
        vector = out[0].float().numpy()
        if not np.all(np.isfinite(vector)):
            raise ConformanceError("output holds NaN or infinite weights")
        if (vector < 0).any():
            raise ConformanceError(
                f"output holds {int((vector < 0).sum())} negative weights (neural-search rejects them)"
            )
        return vector

    def predict(self, texts: list[str], embedding_format: EmbeddingFormat = "word") -> list[dict[str, float]]:
        """One ``{token: weight}`` map per text, in order, as ``dataAsMap.response[0]`` holds it."""
        fmt = _normalise_format(embedding_format)
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, not one string")
        results = []
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"every text must be a string, got {type(text).__name__}")
            if self.function_name == "SPARSE_ENCODING":
                results.append(vector_to_map(self.raw_output(text), self.decode_table, fmt))
            else:
                results.append(self._tokenize(text, fmt))
        return results

    def _tokenize(self, text: str, fmt: str) -> dict[str, float]:
        # SparseTokenizerModel.predict: distinct ids in order, decode, skip "", idf or 1.0
        out: dict[str, float] = {}
        for idx in dict.fromkeys(self.encode_ids(text)):
            token = self.decode_table[idx]
            if token == "":
                continue
            key = str(idx) if fmt == "token_id" else token
            out[key] = self.idf.get(token, 1.0)
        return out
