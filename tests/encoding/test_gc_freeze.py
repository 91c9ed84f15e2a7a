"""``frozen_heap``: the collector skips the objects alive when a packed encode starts, and only while it runs."""
from __future__ import annotations

import gc
import threading
import weakref

import pytest

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.gc_freeze import frozen_heap


@pytest.fixture(autouse=True)
def _collector_on_and_nothing_frozen():
    assert gc.get_freeze_count() == 0
    enabled = gc.isenabled()
    gc.enable()
    yield
    assert gc.get_freeze_count() == 0  # nothing left frozen by a test
    if not enabled:
        gc.disable()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_objects_alive_on_entry_are_skipped_until_the_outermost_exit_then_collected():
    doomed = _Cycle()
    gone = weakref.ref(doomed)
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        with frozen_heap():  # nested: one freeze
            pass
        assert gc.get_freeze_count() > 0
        del doomed
        gc.collect()
        assert gone() is not None  # frozen garbage waits
        fresh = _Cycle()
        fresh_ref = weakref.ref(fresh)
        del fresh
        gc.collect()
        assert fresh_ref() is None  # what the encode itself drops is collected as usual
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


def test_threads_share_one_freeze_and_the_last_one_out_unfreezes():
    entered, release = threading.Barrier(3), threading.Event()

    def encode() -> None:
        with frozen_heap():
            entered.wait()
            release.wait()

    threads = [threading.Thread(target=encode) for _ in range(2)]
    for t in threads:
        t.start()
    entered.wait()
    with frozen_heap():
        pass  # a third, short encode ends while the others still run
    assert gc.get_freeze_count() > 0
    release.set()
    for t in threads:
        t.join()
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_or_stopped_the_collector_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() == frozen  # not unfrozen behind the caller's back
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with frozen_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_packed_encode_runs_with_the_heap_frozen_unless_told_not_to(tiny_source_dir, monkeypatch):
    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batching="packed", max_batch_tokens=512)
    seen = []
    take = type(enc.runner)._take
    monkeypatch.setattr(type(enc.runner), "_take", lambda self, *a: seen.append(gc.get_freeze_count()) or take(self, *a))
    texts = [f"house {i} " * (1 + i % 7) for i in range(40)]
    frozen = enc.encode(texts)
    assert seen and all(count > 0 for count in seen) and gc.get_freeze_count() == 0
    seen.clear()
    enc.runner.freeze_heap = False
    plain = enc.encode(texts)
    assert seen and all(count == 0 for count in seen)
    assert all((a.ids == b.ids).all() and (a.weights == b.weights).all() for a, b in zip(frozen, plain))


def test_an_idle_pipeline_lets_the_heap_thaw_and_freezes_it_again_for_the_next_chunk(tiny_source_dir, monkeypatch):
    """The device thread of ``lsr-os index`` (and of each Ray actor) holds the frozen heap while it encodes, not
    while it waits for a chunk: an encoder left open does not keep the process's collector off its objects."""
    import time

    from opensearch_lsr.encoding.encode_pipeline import PipelinedEncoder

    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batching="packed", max_batch_tokens=512)
    seen = []
    take = type(enc.runner)._take
    monkeypatch.setattr(type(enc.runner), "_take", lambda self, *a: seen.append(gc.get_freeze_count()) or take(self, *a))
    pipeline = PipelinedEncoder(enc, window_docs=16)
    try:
        texts = [f"house {i} " * (1 + i % 7) for i in range(40)]
        for _ in range(2):
            assert len(pipeline.submit(texts).result(timeout=60)) == 40
            deadline = time.monotonic() + 10
            while gc.get_freeze_count() and time.monotonic() < deadline:  # the thread drains, then waits
                time.sleep(0.01)
            assert gc.get_freeze_count() == 0  # idle: thawed
        assert seen and all(count > 0 for count in seen)  # every batch taken with the heap frozen
    finally:
        pipeline.close()
    assert gc.get_freeze_count() == 0


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_held_the_bookkeeping_lock_does_not_hang():
    import os
    import select
    import signal

    from opensearch_lsr.encoding import gc_freeze

    held, forked = threading.Event(), threading.Event()

    def other_encode() -> None:  # another encoding thread, inside the bookkeeping when the fork comes
        with gc_freeze._lock:
            held.set()
            forked.wait(20)

    other = threading.Thread(target=other_encode)
    with frozen_heap():
        read, write = os.pipe()
        other.start()
        held.wait(20)
        pid = os.fork()
        if pid:
            forked.set()
            other.join()
        if pid == 0:  # the child: frozen_heap must neither block nor unfreeze what the parent froze
            ok = False
            try:
                inherited = gc.get_freeze_count()
                with frozen_heap():
                    pass
                ok = inherited > 0 and gc.get_freeze_count() == inherited
            finally:
                os.write(write, b"1" if ok else b"0")
                os._exit(0)
        os.close(write)
        ready, _, _ = select.select([read], [], [], 20)
        answer = os.read(read, 1) if ready else b"hung"
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
    assert answer == b"1"


def test_a_stream_alone_freezes_nothing_so_an_abandoned_one_cannot_leave_the_heap_frozen(tiny_source_dir):
    """The freeze is held by the function that owns the loop (``run``, ``run_texts``, the job's device thread),
    never by the generator: a generator dropped mid-way inside a reference cycle would otherwise keep it."""
    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batching="packed", max_batch_tokens=512)
    tokens = enc.once_tokenizer([f"house {i} " * (1 + i % 7) for i in range(40)])
    batches = iter([(b, tokens.select(b)) for b in [list(range(20)), list(range(20, 40))]])
    stream = enc.runner.stream(batches)
    next(stream)
    assert gc.get_freeze_count() == 0
    holder = [stream]
    holder.append(holder)  # abandoned inside a cycle
    del holder, stream
    with enc.runner.heap_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
