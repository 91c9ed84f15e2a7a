"""Bridge embedding cache: reused across calls and across concurrent callers (file lock)."""
from __future__ import annotations

import threading
import time

import numpy as np

from opensearch_lsr.transfer.bridge import Bridge


class CountingBridge(Bridge):
    name = "test:counting"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.calls = 0
        self.lock = threading.Lock()

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        with self.lock:
            self.calls += 1
        time.sleep(0.2)  # long enough for a second caller to arrive while the first is embedding
        return np.array([[len(t), 1.0, float(sum(map(ord, t)) % 7)] for t in texts])


def test_cache_hit_and_concurrent_callers_embed_once(tmp_path, monkeypatch):
    monkeypatch.setenv("LSR_CACHE", str(tmp_path))
    bridge = CountingBridge(batch_size=2)
    texts = ["집", "house", "##ing", "ing", "고양이"]
    results = []
    threads = [threading.Thread(target=lambda: results.append(bridge.embed(texts))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uniq_batches = 3  # 5 distinct strings in batches of 2, embedded by one caller; the others read its file
    assert bridge.calls == uniq_batches
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    np.testing.assert_allclose(np.linalg.norm(results[0], axis=1), 1.0, rtol=1e-6)
    bridge.embed(texts)
    assert bridge.calls == uniq_batches
    assert not list(tmp_path.rglob("*.tmp.npy"))


def test_no_cache_always_embeds(tmp_path, monkeypatch):
    monkeypatch.setenv("LSR_CACHE", str(tmp_path))
    bridge = CountingBridge(use_cache=False)
    bridge.embed(["a", "b"])
    bridge.embed(["a", "b"])
    assert bridge.calls == 2
    assert not list(tmp_path.rglob("*.npy"))
