"""How :func:`capture_cuda_graph` records, with the CUDA calls it makes faked (the real ones need a card: ``pytest -m
gpu``, ``test_packed_gpu.py``)."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from opensearch_lsr.encoding import graph_replay


class _Stream:
    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def wait_stream(self, other: _Stream) -> None:
        self.calls.append(f"{self.name} waits for {other.name}")


@pytest.fixture
def fake_cuda(monkeypatch):
    calls: list[str] = []
    state = {"current": _Stream("main", calls)}

    class Graph:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            calls.append(f"capture_begin on {state['current'].name} pool={pool} mode={capture_error_mode}")

        def capture_end(self):
            calls.append("capture_end")

        def replay(self):
            calls.append("replay")

    @contextmanager
    def stream(s):
        before, state["current"] = state["current"], s
        try:
            yield
        finally:
            state["current"] = before

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: state["current"])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: calls.append("host_empty_cache"), raising=False)
    return calls, state


def test_a_capture_warms_up_then_records_on_the_side_stream_without_emptying_any_cache(fake_cuda):
    calls, state = fake_cuda
    side = _Stream("side", calls)

    def body():
        calls.append(f"body on {state['current'].name}")
        return torch.ones(2)

    replay, out = graph_replay.capture_cuda_graph(body, pool="pool", side=side)
    assert calls == ["side waits for main", "body on side", "body on side", "main waits for side", "synchronize",
                     "capture_begin on side pool=pool mode=thread_local", "body on side", "capture_end"]
    assert torch.equal(out, torch.ones(2)) and state["current"].name == "main"
    replay()
    assert calls[-1] == "replay"


def test_a_failed_capture_is_ended_and_its_error_raised(fake_cuda):
    calls, _ = fake_cuda
    seen = []

    def body():
        seen.append(1)
        if len(seen) > 2:  # the warm-up passes, the recording fails
            raise RuntimeError("operation not permitted when stream is capturing")
        return torch.ones(1)

    with pytest.raises(RuntimeError, match="capturing"):
        graph_replay.capture_cuda_graph(body, pool=None, side=_Stream("side", calls))
    assert calls[-1] == "capture_end" and "empty_cache" not in calls
