"""What the double was corrected to after the real OpenSearch 3.6.0 node answered differently
(``docs/opensearch-double-deviations.md`` section 4; the live comparison is
``tests/opensearch_real/test_double_agrees.py``)."""
from __future__ import annotations

import pytest
from double.fixtures import os_client, os_double  # noqa: F401
from opensearchpy.exceptions import NotFoundError, RequestError


def _rank_index(client, name="fid"):
    client.indices.create(index=name, body={"mappings": {"properties": {"sparse_embedding": {"type": "rank_features"},
                                                                          "text": {"type": "text"}}}})
    return name


def test_refused_rank_features_value_is_failed_to_parse_with_its_cause(os_client):
    from opensearch_lsr.opensearch.bulk import OpenSearchBulkWriter

    index = _rank_index(os_client)
    [out] = OpenSearchBulkWriter(os_client, index).write([{"_id": "z", "_source": {"sparse_embedding": {"a": 0.0}}}])
    assert not out.ok and out.error["type"] == "mapper_parsing_exception"
    assert out.error["caused_by"]["reason"].startswith("featureValue must be a positive normal float, got: 0.0 for "
                                                       "feature a on field sparse_embedding")
    # the toolkit's dead-letter reason carries the cause, not only "failed to parse"
    assert out.error["reason"].startswith("failed to parse: featureValue must be a positive normal float")


def test_missing_model_names_its_id(os_client):
    with pytest.raises(NotFoundError, match="Failed to find model with the provided model id: nope"):
        os_client.plugins.ml.get_model(model_id="nope")
    index = _rank_index(os_client)
    body = {"query": {"neural_sparse": {"sparse_embedding": {"query_text": "x", "model_id": "nope"}}}}
    with pytest.raises(NotFoundError, match="Failed to find model with the provided model id: nope"):
        os_client.search(index=index, body=body)


def test_query_building_errors_come_back_as_shard_failures(os_client):
    index = _rank_index(os_client)
    with pytest.raises(RequestError) as err:
        os_client.search(index=index, body={"query": {"neural_sparse": {"sparse_embedding": {"query_tokens": {"a": -1}}}}})
    assert err.value.error == "search_phase_execution_exception"
    assert err.value.info["error"]["root_cause"][0] == {"type": "query_shard_exception", "index": index,
                                                        "reason": "failed to create query: weight must be in (0, 64.0], got: -1.0"}
    with pytest.raises(RequestError, match="failed to create query: \\[neural_sparse\\] query only works on"):
        os_client.search(index=index, body={"query": {"neural_sparse": {"text": {"query_tokens": {"a": 1.0}}}}})


def test_unknown_setting_is_a_settings_exception(os_client):
    with pytest.raises(RequestError) as err:
        os_client.cluster.put_settings(body={"persistent": {"plugins.ml_commons.no_such_setting": True}})
    assert err.value.error == "settings_exception"


def test_two_phase_parameter_messages_are_the_processors(os_client):
    body = {"request_processors": [{"neural_sparse_two_phase_processor": {"two_phase_parameter": {"expansion_rate": 0.5}}}]}
    with pytest.raises(RequestError, match=r"The two_phase_parameter.expansion_rate must >= 1.0. Received: 0.500000"):
        os_client.transport.perform_request("PUT", "/_search/pipeline/p", body=body)


def test_delete_takes_a_comma_separated_list(os_client):
    _rank_index(os_client, "a1")
    _rank_index(os_client, "a2")
    with pytest.raises(NotFoundError):
        os_client.indices.delete(index="a1,missing")
    assert os_client.indices.exists(index="a1")
    os_client.indices.delete(index="a1,a2")
    assert not os_client.indices.exists(index="a1") and not os_client.indices.exists(index="a2")
