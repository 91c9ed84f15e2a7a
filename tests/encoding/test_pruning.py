from __future__ import annotations

import numpy as np
import pytest

from opensearch_lsr.encoding.pruning import PruneConfig, parse_prune, prune_arrays, prune_map

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
