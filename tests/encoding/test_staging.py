"""One buffer, one copy: a packed batch's ids and index tensors cross to the device together, and a captured
graph's inputs are refreshed together."""
import numpy as np
import pytest
import torch

from opensearch_lsr.encoding.graph_replay import GraphReplay, _staged_with
from opensearch_lsr.encoding.packed import Segments
from opensearch_lsr.encoding.staging import is_view_of, rebase, stage

CPU = torch.device("cpu")


def test_arrays_of_mixed_types_come_back_equal_as_aligned_views_of_one_buffer():
    arrays = [np.array([1, 2, 3], np.int32), np.array([7, -8], np.int64), np.array([0.5, np.nan, -np.inf], np.float32),
              np.array([9], np.int64), np.array([], np.int64), np.array([4, 5], np.uint8), np.array([6], np.int32)]
    buffer, views = stage(arrays, CPU, pin=False)
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1
    for a, v in zip(arrays, views):
        assert v.dtype == torch.from_numpy(a).dtype and is_view_of(v, buffer)
        np.testing.assert_array_equal(v.numpy(), a)
        assert (v.storage_offset() * v.element_size()) % a.itemsize == 0
    # views, not copies: what the buffer holds is what they read
    buffer.zero_()
    assert all(not v.numpy().any() for v in views)
    with pytest.raises(ValueError, match="1-D"):
        stage([np.zeros((2, 2))], CPU, pin=False)


def test_rebase_gives_the_same_views_on_another_buffer_of_that_layout():
    arrays = [np.arange(5, dtype=np.int64), np.arange(3, dtype=np.int32) + 10]
    buffer, views = stage(arrays, CPU, pin=False)
    other = buffer.clone()
    moved = rebase(views, buffer, other)
    assert all(is_view_of(m, other) and not is_view_of(m, buffer) for m in moved)
    assert [m.tolist() for m in moved] == [v.tolist() for v in views]
    buffer.copy_(stage([np.arange(5, dtype=np.int64) * 2, np.arange(3, dtype=np.int32)], CPU, pin=False)[0])
    other.copy_(buffer)  # one copy refreshes every view
    assert [m.tolist() for m in moved] == [[0, 2, 4, 6, 8], [0, 1, 2]]
    with pytest.raises(ValueError, match="same size"):
        rebase(views, buffer, other[:-1])
    with pytest.raises(ValueError, match="views of the buffer"):
        rebase([torch.zeros(2, dtype=torch.long)], buffer, other)


@pytest.mark.parametrize("pad_to", [None, (64, 8)])
def test_a_packed_batch_stages_ids_and_segments_in_one_buffer_equal_to_building_them_apart(pad_to):
    lengths = np.array([5, 9, 1, 12])
    ids = np.arange(int(lengths.sum())) + 100
    device_ids, seg = Segments.packed_batch(ids, lengths, CPU, pad_to=pad_to, max_doc=32)
    alone = Segments.from_lengths(lengths, CPU, pad_to=pad_to, max_doc=32)
    assert _staged_with(device_ids, seg) is seg.staged is not None
    expected_ids = ids if pad_to is None else np.concatenate([ids, np.zeros(pad_to[0] - len(ids), np.int64)])
    assert device_ids.dtype == torch.long and device_ids.tolist() == expected_ids.tolist()
    for name in ("lengths", "cu_seqlens", "positions", "pad_slots"):
        got, want = getattr(seg, name), getattr(alone, name)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), name
    assert seg.cu_seqlens.dtype == torch.int32 and seg.max_len == alone.max_len and seg.real_tokens == alone.real_tokens
    with pytest.raises(ValueError, match="ids for documents"):
        Segments.packed_batch(ids[:-1], lengths, CPU)


def _probe_body(ids, seg):
    """Reads every input: a stale one changes its output."""
    per_token = ids + seg.positions * 1000 + seg.pad_slots * 10**6
    per_batch = seg.cu_seqlens[-1].long() + seg.lengths.sum() * 10**9
    return (per_token + per_batch).double()[:, None]


def _rerun_capture(fn):
    out = fn()
    return (lambda: out.copy_(fn())), out


def test_a_replay_refreshes_a_staged_batchs_captured_inputs_with_one_copy_and_others_tensor_by_tensor():
    rng = np.random.default_rng(3)
    lengths = np.array([4, 7, 2])
    graphs = GraphReplay(_probe_body, capture=_rerun_capture, capture_after=1)
    batches = [Segments.packed_batch(rng.integers(5, 900, 13), rng.permutation(lengths), CPU) for _ in range(3)]
    for ids, seg in batches:
        assert graphs(ids, seg).tolist() == _probe_body(ids, seg).tolist()
    (static_ids, static_seg, _, _), = graphs._graphs.values()
    assert _staged_with(static_ids, static_seg) is static_seg.staged is not None  # refreshed as one buffer
    assert graphs.stats.captured == 1 and graphs.stats.replays == 3
    # ids that are not in the segments' buffer: still right, copied one by one
    ids, seg = batches[0]
    apart = ids.clone()
    assert _staged_with(apart, seg) is None
    assert graphs(apart + 1, seg).tolist() == _probe_body(apart + 1, seg).tolist()
    fresh = GraphReplay(_probe_body, capture=_rerun_capture, capture_after=1)
    for ids, seg in batches:
        assert fresh(ids.clone(), seg).tolist() == _probe_body(ids, seg).tolist()
    (static_ids, static_seg, _, _), = fresh._graphs.values()
    assert static_seg.staged is None and _staged_with(static_ids, static_seg) is None
