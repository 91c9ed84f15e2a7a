"""Keep Python's cycle collector off the objects that were alive before a packed encode started.

A full (generation-2) collection stops every thread while it walks every tracked object: half a million or more
once torch, transformers and a model are loaded, more with what compiling and the caller leave. Inside an encode on
a 2-core EPYC one took 332 ms (``benchmarks/gc_pauses.py``, ``benchmarks/results/gc_pauses.md``), and on a GPU the
device idles while the launching thread waits (the H200 profiles of ``gpu_encode.py`` show gaps of 44-67 ms, not
yet set against collections). ``gc.freeze()`` moves every tracked object into a permanent generation
that collections skip; ``gc.unfreeze()`` moves them back into the oldest one. Both are constant-time list splices.
Inference servers freeze once after their warm-up (vLLM's ``freeze_gc_heap`` after compiling and warming up,
SGLang's ``freeze_gc``); a library shares its process, so :func:`frozen_heap` freezes only while a packed encode
runs and unfreezes when the last one ends (a device thread waiting for work lets go of it: :func:`thawed`).
Objects that die meanwhile are collected after the unfreeze (or freed at once by reference counting, as nearly
all are). A process that froze objects itself, or turned the collector
off, is left as it is.
"""
from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap", "thawed"]

_lock = threading.Lock()
_depth = 0
_owned = False


def _reset_in_child() -> None:
    """A forked child has none of the parent's encoding threads: fresh bookkeeping, and a lock no thread holds
    (what the parent froze stays frozen there, which is what a fork wants)."""
    global _lock, _depth, _owned
    _lock, _depth, _owned = threading.Lock(), 0, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def _acquire() -> None:
    global _depth, _owned
    with _lock:
        if _depth == 0:
            _owned = gc.isenabled() and gc.get_freeze_count() == 0
            if _owned:
                gc.freeze()
        _depth += 1


def _release() -> None:
    global _depth, _owned
    with _lock:
        _depth -= 1
        if _depth == 0 and _owned:
            gc.unfreeze()
            _owned = False


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Objects alive on entry are skipped by the collector until the outermost ``frozen_heap`` exits (threads
    share one freeze); does nothing where the collector is off or objects were frozen before."""
    _acquire()
    try:
        yield
    finally:
        _release()


@contextmanager
def thawed() -> Iterator[None]:
    """Inside a :func:`frozen_heap`: let go of it while waiting for work (the heap thaws unless another encode
    holds it), and take it again after, so an idle encoder does not keep the process's heap frozen."""
    _release()
    try:
        yield
    finally:
        _acquire()
