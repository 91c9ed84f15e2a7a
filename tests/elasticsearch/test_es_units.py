"""Unit rules: Elasticsearch's BERT tokenizer, sparse_vector keys, client options, index bodies, queries."""
from __future__ import annotations

import pytest

from opensearch_lsr.elasticsearch.client import EsConnectionError, EsFeatures, describe_connection, make_es_client
from opensearch_lsr.elasticsearch.indices import EsIndexError, index_body, index_options, pipeline_body
from opensearch_lsr.elasticsearch.keys import es_key, key_collisions, sanitize_features
from opensearch_lsr.elasticsearch.query import rrf_body, sparse_vector_query
from opensearch_lsr.elasticsearch.tokenizer import EsBertTokenizer, compare_tokenizers

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "서울", "특별시", "##시", "한국", "cafe", "Cafe", ".", "a", "##b",
         "é", "e", "##s"]


def es(**kw):
    return EsBertTokenizer(VOCAB, **kw)


def ids(tok, text):
    return [VOCAB[i] for i in tok.encode(text)]


def test_basic_chain_matches_the_java_rules():
    tok = es()
    assert ids(tok, "서울 특별시.") == ["[CLS]", "서울", "특별시", ".", "[SEP]"]
    assert ids(tok, "서울\u00a0특별시") == ["[CLS]", "[UNK]", "[SEP]"]  # no-break space is not Java whitespace
    assert ids(tok, "서울\u200b 한국") == ["[CLS]", "서울", "한국", "[SEP]"]  # Cf dropped by ControlCharFilter
    assert ids(tok, "서울😀 한국") == ["[CLS]", "서울", "한국", "[SEP]"]  # astral = surrogates, dropped
    assert ids(tok, "[MASK] [CLS]") == ["[CLS]", "[MASK]", "[UNK]", "[UNK]", "[UNK]", "[SEP]"]
    assert ids(tok, "ab" + "b" * 99) == ["[CLS]", "[UNK]", "[SEP]"]  # > 100 chars: one [UNK]
    assert ids(tok, "abb") == ["[CLS]", "a", "##b", "##b", "[SEP]"]


def test_lower_case_is_a_case_insensitive_vocabulary_and_strips_accents():
    assert ids(es(), "CAFE") == ["[CLS]", "[UNK]", "[SEP]"]
    lower = es(do_lower_case=True)
    assert lower.encode("CAFE")[1] in (VOCAB.index("cafe"), VOCAB.index("Cafe"))
    assert ids(lower, "é") == ["[CLS]", "e", "[SEP]"]  # NFD + drop Mn (strip accents defaults to lower case)
    assert ids(es(), "é") == ["[CLS]", "é", "[SEP]"]


def test_truncation_first_and_padding_request():
    tok = es(max_sequence_length=4)
    assert ids(tok, "서울 한국 서울 한국") == ["[CLS]", "서울", "한국", "[SEP]"]
    with pytest.raises(ValueError, match="exceeds the maximum"):
        es(max_sequence_length=4, truncate="none").encode("서울 한국 서울")
    req = es().request(["서울", "서울 한국 특별시"])
    assert req["tokens"][0][-1] == 0 and req["arg_1"][0] == [1, 1, 1, 0, 0] and req["arg_3"][1] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"missing required \[\[UNK\]\]"):
        EsBertTokenizer(["[PAD]", "[CLS]", "[SEP]"])


def test_korean_ids_equal_ours_on_the_corpus(shared_data):
    """Elasticsearch's tokenizer vs ours (HF tokenizers) on 300 msmarco-ko passages and 300 queries."""
    from transformers import AutoTokenizer

    from opensearch_lsr.evaluation.datasets import load_beir

    hf = AutoTokenizer.from_pretrained(str(shared_data / "kobigbird-bert-base-tokenizer"), use_fast=True)
    backend = hf.backend_tokenizer
    vocab = [backend.id_to_token(i) for i in range(backend.get_vocab_size())]
    ds = load_beir(shared_data / "msmarco-ko", "dev")
    texts = list(ds.corpus.values())[:300] + list(ds.queries.values())[:300]
    report = compare_tokenizers(EsBertTokenizer(vocab, do_lower_case=False), backend, texts)
    assert report.texts == 600 and report.identical >= 599, report.differences
    assert not compare_tokenizers(EsBertTokenizer(vocab), backend, ["서울\u00a0특별시"]).all_identical


def test_keys_follow_the_mapper_and_the_model():
    assert es_key("u.s.") == "u__s__" and es_key("##s") == "##s"
    assert key_collisions(["a.b", "x", "a__b"]) == [(0, 2, "a__b")]
    assert sanitize_features({"a.b": 0.5, "a__b": 0.7, "z": 0.0, "n": float("nan"), "k": 1.0}) == {"a__b": 0.7, "k": 1.0}
    with pytest.raises(ValueError, match="cannot be indexed"):
        sanitize_features({"x" * 40000: 1.0})


def test_client_options_and_redaction():
    with pytest.raises(EsConnectionError, match="exactly one"):
        make_es_client("http://h:9200", cloud_id="name:abc")
    with pytest.raises(EsConnectionError, match="not both"):
        make_es_client("http://h:9200", api_key="k", user="u", password="p")
    with pytest.raises(EsConnectionError, match="contradict"):
        make_es_client("https://h:9200", insecure=True, ca_certs="/x.pem")
    client = make_es_client("https://h:9200", api_key="secret")
    assert client.transport.node_pool.get().config.verify_certs is True  # TLS verification on by default
    d = describe_connection(url="https://elastic:pw@h:9200", api_key="secret", cloud_id="dep:c2VjcmV0")
    assert "pw" not in str(d) and "secret" not in str(d) and "c2VjcmV0" not in str(d) and d["auth"] == "api_key"


def test_version_gates():
    old, new = EsFeatures.from_version("8.15.2", {"analysis-icu"}), EsFeatures.from_version("9.1.0", {"analysis-nori"})
    assert old.sparse_vector_query and not old.rrf_retriever and not old.index_pruning and old.nori is False
    assert new.rrf_retriever and new.index_pruning and EsFeatures.from_version("8.19.0").index_pruning
    with pytest.raises(EsIndexError, match="8.19 / 9.1"):
        index_options(old, prune=True)
    body = index_body(old)
    assert body["settings"]["analysis"]["analyzer"]["korean"]["tokenizer"] == "standard"  # cjk fallback
    assert "index_options" not in body["mappings"]["properties"]["sparse_embedding"]
    with pytest.raises(EsIndexError, match="analysis-nori"):
        index_body(old, text_analyzer="nori")
    opts = index_options(new, prune=True, tokens_freq_ratio_threshold=5, tokens_weight_threshold=0.4)
    body = index_body(new, options=opts, default_pipeline="p")
    assert body["mappings"]["properties"]["sparse_embedding"]["index_options"]["pruning_config"][
        "tokens_weight_threshold"] == 0.4
    assert body["settings"]["index"]["default_pipeline"] == "p"
    assert pipeline_body("m")["processors"][0]["inference"]["input_output"][0]["output_field"] == "sparse_embedding"
    with pytest.raises(ValueError, match="8.16"):
        rrf_body("text", "q", {"match_all": {}}, features=old)


def test_sparse_vector_query_rules():
    q = sparse_vector_query("f", query_vector={"a.b": 1.0, "c": 0.0})
    assert q == {"sparse_vector": {"field": "f", "query_vector": {"a__b": 1.0}}}
    with pytest.raises(ValueError, match="exactly one"):
        sparse_vector_query("f", query_vector={"a": 1.0}, inference_id="e", query="x")
    with pytest.raises(ValueError, match="non-empty query"):
        sparse_vector_query("f", inference_id="e")
    with pytest.raises(ValueError, match="between"):
        sparse_vector_query("f", inference_id="e", query="x", tokens_freq_ratio_threshold=0.5)
    with pytest.raises(ValueError, match="8.15"):
        sparse_vector_query("f", query_vector={"a": 1.0}, features=EsFeatures.from_version("8.14.0"))


def test_export_refuses_tokenizers_elasticsearch_cannot_mirror():
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    from opensearch_lsr.elasticsearch.export import EsExportError, _bert_settings, es_model_id

    vocab = {t: i for i, t in enumerate(VOCAB)}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    with pytest.raises(EsExportError, match="BertNormalizer"):
        _bert_settings(object(), tok)
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, handle_chinese_chars=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    with pytest.raises(EsExportError, match="CJK"):
        _bert_settings(object(), tok)
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    assert _bert_settings(object(), tok) == {"do_lower_case": True}
    assert es_model_id("Org/My Model.v1") == "org__my_model.v1"


def test_cloud_id_and_basic_auth_clients():
    import base64

    cloud_id = "ko-deploy:" + base64.b64encode(b"eu-west-1.aws.found.io:443$abc123$def456").decode()
    client = make_es_client(cloud_id=cloud_id, user="elastic", password="pw")
    node = client.transport.node_pool.get().config
    assert node.host == "abc123.eu-west-1.aws.found.io" and node.scheme == "https" and node.verify_certs is True
    assert "pw" not in str(describe_connection(cloud_id=cloud_id, user="elastic", password="pw"))
    with pytest.raises(EsConnectionError, match="invalid connection options|cloud"):
        make_es_client(cloud_id="not-a-cloud-id")
