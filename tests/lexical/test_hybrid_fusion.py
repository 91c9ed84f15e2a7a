"""Hybrid fusion against hand-computed normalisations (neural-search semantics)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from opensearch_lsr.lexical.fusion import FusionError, HybridFusion, fuse_runs

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"

BM25 = [("a", 10.0), ("b", 6.0), ("c", 2.0)]
SPARSE = [("b", 3.0), ("d", 1.0)]


def test_min_max_weighted_mean_by_hand():
    fused = HybridFusion("min_max", (0.3, 0.7)).fuse([BM25, SPARSE])
    # bm25 min-max: a 1, b (6-2)/(10-2) = 0.5, c 0 -> 0.001; sparse: b 1, d 0 -> 0.001
    # a = 0.3*1 = 0.3, b = 0.3*0.5 + 0.7*1 = 0.85, c = 0.3*0.001 = 0.0003, d = 0.7*0.001 = 0.0007
    assert [k for k, _ in fused] == ["b", "a", "d", "c"]
    got = dict(fused)
    assert got["b"] == pytest.approx(0.85, rel=1e-6)
    assert got["a"] == pytest.approx(0.3, rel=1e-6)
    assert got["d"] == pytest.approx(0.0007, rel=1e-4)
    assert got["c"] == pytest.approx(0.0003, rel=1e-4)


def test_min_max_single_and_tied_results_score_one():
    fused = dict(HybridFusion("min_max", (0.5, 0.5)).fuse([[("a", 4.2)], [("b", 7.0), ("c", 7.0)]]))
    # one hit: max == min == score -> 1.0; two tied hits: both 1.0
    assert fused == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.5})


def test_unweighted_mean_divides_by_the_number_of_sub_queries():
    fused = dict(HybridFusion("min_max").fuse([BM25, SPARSE]))
    assert fused["b"] == pytest.approx((0.5 + 1.0) / 2)
    assert fused["a"] == pytest.approx(0.5)


def test_rrf_by_hand_and_ties_keep_first_appearance():
    fused = HybridFusion("rrf", rank_constant=60).fuse([BM25, SPARSE])
    got = dict(fused)
    assert got["a"] == pytest.approx(1 / 61) and got["c"] == pytest.approx(1 / 63)
    assert got["b"] == pytest.approx(1 / 62 + 1 / 61) and got["d"] == pytest.approx(1 / 62)
    assert [k for k, _ in fused] == ["b", "a", "d", "c"]
    tied = HybridFusion("rrf", rank_constant=1).fuse([[("x", 9.0)], [("y", 1.0)]])
    assert tied == [("x", 0.5), ("y", 0.5)]


def test_size_cuts_after_fusion():
    assert len(HybridFusion("rrf").fuse([BM25, SPARSE], size=2)) == 2


def test_invalid_settings_use_the_servers_words():
    with pytest.raises(FusionError, match="sum of weights for combination must be equal to 1.0"):
        HybridFusion("min_max", (0.5, 0.6))
    with pytest.raises(FusionError, match=r"range \[0.0 ... 1.0\]"):
        HybridFusion("min_max", (1.5, -0.5))
    with pytest.raises(FusionError, match="between 1 and 10000"):
        HybridFusion("rrf", rank_constant=0)
    with pytest.raises(FusionError, match="number of weights \\[2\\] must match number of sub-queries \\[3\\]"):
        HybridFusion("min_max", (0.5, 0.5)).fuse([BM25, SPARSE, BM25])
    with pytest.raises(FusionError, match="technique must be one of min_max, z_score, l2, rrf"):
        HybridFusion("max")  # type: ignore[arg-type]


def test_reads_the_repository_pipelines_and_both_rrf_shapes():
    norm = HybridFusion.from_pipeline(json.loads((PIPELINES / "search_hybrid_normalization.json").read_text()))
    assert norm == HybridFusion("min_max", (0.3, 0.7))
    rrf = HybridFusion.from_pipeline(json.loads((PIPELINES / "search_hybrid_rrf.json").read_text()))
    assert rrf == HybridFusion("rrf", None, 60)
    old = {"phase_results_processors": [{"score-ranker-processor": {
        "combination": {"technique": "rrf", "parameters": {"rank_constant": 20}}}}]}
    assert HybridFusion.from_pipeline(old).rank_constant == 20
    assert HybridFusion.from_pipeline(HybridFusion("rrf", (0.4, 0.6), 7).pipeline()) == HybridFusion("rrf", (0.4, 0.6), 7)
    with pytest.raises(FusionError, match="no phase_results_processors"):
        HybridFusion.from_pipeline({"request_processors": []})
    with pytest.raises(FusionError, match="min_max, z_score, l2 without parameters"):
        HybridFusion.from_pipeline({"phase_results_processors": [{"normalization-processor": {
            "normalization": {"technique": "min_max", "parameters": {"lower_bounds": [{"mode": "clip"}]}}}}]})
    with pytest.raises(FusionError, match="arithmetic_mean with l2"):
        HybridFusion.from_pipeline({"phase_results_processors": [{"normalization-processor": {
            "normalization": {"technique": "l2"}, "combination": {"technique": "harmonic_mean"}}}]})
    for technique in ("z_score", "l2"):
        fusion = HybridFusion(technique, (0.4, 0.6))  # type: ignore[arg-type]
        body = fusion.pipeline()
        assert body["phase_results_processors"][0]["normalization-processor"]["normalization"] == {
            "technique": technique}
        assert HybridFusion.from_pipeline(body) == fusion


def test_fuse_runs_cuts_each_run_to_the_window_before_normalising():
    bm25 = {"q": dict(BM25), "only-bm25": {"a": 1.0}}
    sparse = {"q": {"d": 1.0, "b": 3.0, "e": 0.5}}  # unsorted on purpose; window 2 drops e
    run = fuse_runs([bm25, sparse], "min_max", (0.3, 0.7), window=2)
    # bm25 window [a 10, b 6]: a 1, b 0.001; sparse window [b 3, d 1]: b 1, d 0.001
    assert list(run["q"]) == ["b", "a"]
    assert run["q"]["b"] == pytest.approx(0.3 * 0.001 + 0.7)
    assert run["only-bm25"] == pytest.approx({"a": 0.3})


def test_z_score_by_hand():
    """neural-search ZScoreNormalizer: (s - mean) / sd with the n - 1 deviation, at most 0 -> 0.001, a score
    equal to the mean -> the max, one hit -> its own score (equal to the mean)."""
    import numpy as np

    from opensearch_lsr.lexical.fusion import normalise_scores

    scores = np.asarray([10.0, 6.0, 2.0], np.float32)  # mean 6, sd 4
    assert normalise_scores("z_score", scores).tolist() == pytest.approx([1.0, 10.0, 0.001])
    assert normalise_scores("z_score", np.asarray([9.0, 5.0, 3.0, 3.0], np.float32)).tolist() == pytest.approx(
        [(9 - 5) / np.std([9, 5, 3, 3], ddof=1), 9.0, 0.001, 0.001])
    assert normalise_scores("z_score", np.asarray([4.5], np.float32)).tolist() == [4.5]
    fused = dict(HybridFusion("z_score", (0.3, 0.7)).fuse([BM25, SPARSE]))
    # bm25: a 1, b 10 (the mean), c 0.001; sparse (mean 2, sd sqrt(2)): b sqrt(2)/2 = 0.7071, d 0.001
    assert fused["b"] == pytest.approx(0.3 * 10 + 0.7 * 0.70710677, rel=1e-6)
    assert fused["a"] == pytest.approx(0.3, rel=1e-6) and fused["d"] == pytest.approx(0.0007, rel=1e-4)


def test_l2_by_hand():
    import numpy as np

    from opensearch_lsr.lexical.fusion import normalise_scores

    assert normalise_scores("l2", np.asarray([3.0, 4.0], np.float32)).tolist() == pytest.approx([0.6, 0.8])
    assert normalise_scores("l2", np.asarray([0.0, 0.0], np.float32)).tolist() == [0.0, 0.0]
    fused = dict(HybridFusion("l2", (0.5, 0.5)).fuse([BM25, SPARSE]))
    norm_a, norm_b = np.sqrt(100 + 36 + 4), np.sqrt(9 + 1)
    assert fused["b"] == pytest.approx(0.5 * 6 / norm_a + 0.5 * 3 / norm_b, rel=1e-6)
    assert fused["d"] == pytest.approx(0.5 * 1 / norm_b, rel=1e-6)


def test_integer_keys_tie_in_java_hash_map_order():
    """neural-search sorts the keys of a HashMap<Integer, Float> of Lucene doc ids stably by score: exact ties
    keep the map's iteration order (bucket = id & (capacity - 1), capacity 16 doubling past 0.75 full)."""
    from opensearch_lsr.lexical.fusion import java_hash_map_order

    assert java_hash_map_order([300, 5, 17, 260]) == [17, 260, 5, 300]  # buckets 12, 5, 1, 4 of 16
    assert java_hash_map_order([33, 1, 65]) == [33, 1, 65]  # one bucket: insertion order
    keys = list(range(40, 0, -3))  # 14 keys: the table has grown to 32
    assert java_hash_map_order(keys) == sorted(keys, key=lambda k: k & 31)
    # documents below their sub-query's mean all score the z-score floor: Lucene doc ids order them, not hits
    sub_a = [(900, 9.0), (44, 1.0), (17, 1.0), (3, 1.0)]
    sub_b = [(900, 4.0), (30, 1.0), (2, 1.0)]
    fused = HybridFusion("z_score", (0.5, 0.5)).fuse([sub_a, sub_b])
    assert fused[0][0] == 900
    assert [k for k, _ in fused[1:]] == [17, 2, 3, 44, 30] and len({s for _, s in fused[1:]}) == 1
    strings = HybridFusion("z_score", (0.5, 0.5)).fuse([[(str(k), s) for k, s in sub_a], [(str(k), s) for k, s in sub_b]])
    assert [k for k, _ in strings[1:]] == ["44", "17", "3", "30", "2"]  # first appearance
