from __future__ import annotations

import numpy as np
import pytest

from opensearch_lsr.pruning import PruneConfig, parse_prune, prune_arrays, prune_map

VEC = {"a": 4.0, "b": 1.0, "c": 2.0, "d": 0.5, "e": 2.0}


def test_max_ratio_keeps_at_least_ratio_times_max():
    assert prune_map(VEC, PruneConfig("max_ratio", 0.5)) == {"a": 4.0, "c": 2.0, "e": 2.0}


def test_abs_value_threshold_inclusive():
    assert prune_map(VEC, PruneConfig("abs_value", 1.0)) == {"a": 4.0, "b": 1.0, "c": 2.0, "e": 2.0}


def test_top_k_ties_keep_earlier_key():
    assert prune_map(VEC, PruneConfig("top_k", 2)) == {"a": 4.0, "c": 2.0}
    assert prune_map(VEC, PruneConfig("top_k", 10)) == VEC


def test_alpha_mass_running_sum():
    # total 9.5; sorted 4,2,2,1,0.5 -> running 4,6,8,9,9.5; alpha 0.7 -> <= 6.65 keeps 4 and the first 2
    assert prune_map(VEC, PruneConfig("alpha_mass", 0.7)) == {"a": 4.0, "c": 2.0}


def test_none_and_positive_check():
    assert prune_map(VEC, PruneConfig()) == VEC
    with pytest.raises(ValueError, match="Pruned values must be positive"):
        prune_arrays(np.array([1, 2]), np.array([1.0, 0.0], dtype=np.float32), PruneConfig())


@pytest.mark.parametrize("spec,msg", [("top_k:0", "Illegal"), ("top_k:1.5", "Illegal"), ("max_ratio:1", "Illegal"),
                                      ("alpha_mass:-0.1", "Illegal"), ("abs_value:-1", "Illegal"),
                                      ("bogus:1", "not one of"), ("max_ratio", "TYPE:RATIO")])
def test_validation_like_neural_search(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_prune(spec)


def test_parse_round_trip():
    assert str(parse_prune("max_ratio:0.1")) == "max_ratio:0.1"
    assert parse_prune(None).prune_type == "none"


def _java_reference(vec: dict[str, float], kind: str, ratio: float) -> set[str]:
    """neural-search ``PruneUtils`` (util/prune/PruneUtils.java, 2.19+) transcribed loop by loop, in
    float32 arithmetic as the Java floats are (values distinct, so HashMap order cannot matter)."""
    f = np.float32
    r = f(ratio)
    if kind == "top_k":
        return set(sorted(vec, key=lambda k: -vec[k])[: int(ratio)])
    if kind == "max_ratio":
        mx = max(f(v) for v in vec.values())
        return {k for k, v in vec.items() if f(v) >= f(r * mx)}
    if kind == "abs_value":
        return {k for k, v in vec.items() if f(v) >= r}
    total = f(sum(float(f(v)) for v in vec.values()))  # Java: double stream sum, cast to float
    top, kept = f(0.0), set()
    for k in sorted(vec, key=lambda k: -vec[k]):
        top = f(top + f(vec[k]))
        if top <= f(r * total):
            kept.add(k)
    return kept


@pytest.mark.parametrize("kind,ratio", [("top_k", 1), ("top_k", 7), ("max_ratio", 0.0), ("max_ratio", 0.1),
                                        ("max_ratio", 0.5), ("abs_value", 0.3), ("abs_value", 2.0),
                                        ("alpha_mass", 0.0), ("alpha_mass", 0.4), ("alpha_mass", 0.95)])
def test_matches_java_reference_on_random_vectors(kind, ratio):
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        vals = rng.permutation(np.unique(rng.gamma(1.5, 1.0, size=n).astype(np.float32)))
        vec = {f"t{i}": float(v) for i, v in enumerate(vals) if v > 0}
        got = set(prune_map(vec, PruneConfig(kind, ratio)))
        assert got == _java_reference(vec, kind, ratio)
