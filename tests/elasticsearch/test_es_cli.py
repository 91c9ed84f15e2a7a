"""The CLI surface: export --target, deploy-model/index/search/eval --backend elasticsearch (double), dry run."""
from __future__ import annotations

import json

from click.testing import CliRunner

from opensearch_lsr.cli import cli

CORPUS = {"d1": "서울은 한국의 수도이다", "d2": "고양이가 집에 있다", "d3": "the capital of korea is seoul"}


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_export_target_both_writes_both_artifacts(tmp_path):
    out = tmp_path / "bundle"
    res = CliRunner().invoke(cli, ["export", "splade-tiny", "--out", str(out), "--target", "both", "--no-verify"])
    data = _json(res)
    assert set(data) == {"opensearch", "elasticsearch"}
    assert (out / "sparse_encoding.zip").is_file() and (out / "elasticsearch" / "traced_pytorch_model.pt").is_file()
    assert data["elasticsearch"]["disallowed_operations"] == []


def test_dry_run_requests_file_is_valid_against_the_spec(es_bundle, tmp_path):
    from es_double import EsSpecValidator

    req = tmp_path / "requests.ndjson"
    res = CliRunner().invoke(cli, ["deploy-model", str(es_bundle), "--backend", "elasticsearch", "--dry-run",
                                   "--requests", str(req), "--inference-endpoint", "ko-ep"])
    data = _json(res)
    lines = [json.loads(l) for l in req.read_text().splitlines()]
    assert data["requests"] == len(lines) and data["sequence"][0].startswith("GET /_ml/trained_models/")
    validator = EsSpecValidator.shared()
    for line in lines:
        body = json.dumps(line["body"]).encode() if "body" in line else None
        errors = validator.validate(line["method"], line["path"], {k: str(v) for k, v in line.get("query", {}).items()},
                                    body).errors
        assert errors == [], (line["path"], errors)


def test_deploy_index_search_eval_on_the_double(es_double, es_bundle, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENSEARCH_URL", raising=False)
    monkeypatch.setenv("ELASTICSEARCH_URL", es_double.url)
    runner = CliRunner()
    dep = _json(runner.invoke(cli, ["deploy-model", str(es_bundle), "--backend", "elasticsearch",
                                    "--inference-endpoint", "ko-ep"]))
    assert dep["state"] == "started"
    created = _json(runner.invoke(cli, ["create-index", "docs", "--backend", "elasticsearch", "--prune-tokens",
                                        "--tokens-weight-threshold", "0.3"]))
    assert created["mappings"]["properties"]["sparse_embedding"]["index_options"]["pruning_config"] == {
        "tokens_weight_threshold": 0.3}
    assert created["mappings"]["properties"]["text"]["analyzer"] == "korean"
    pipe = _json(runner.invoke(cli, ["create-pipeline", "ingest", "ko-ingest", "--backend", "elasticsearch",
                                     "--model-id", dep["model_id"]]))
    assert pipe["body"]["processors"][0]["inference"]["model_id"] == dep["model_id"]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": k, "text": v}, ensure_ascii=False) + "\n" for k, v in CORPUS.items()),
                      encoding="utf-8")
    summary = _json(runner.invoke(cli, ["index", "--corpus", str(corpus), "--model", "splade-tiny", "--backend",
                                        "elasticsearch", "--index", "docs", "--work-dir", str(tmp_path / "job"),
                                        "--no-progress", "--threads", "1"]))
    assert summary["indexed"] == 3 and summary["backend"] == "elasticsearch"
    hits = _json(runner.invoke(cli, ["search", "--index", "docs", "--backend", "elasticsearch", "--mode", "model",
                                     "--model-id", "ko-ep", "capital of korea"]))
    assert hits[0]["_id"] == "d3"
    tokens = _json(runner.invoke(cli, ["search", "--index", "docs", "--backend", "elasticsearch", "--mode", "tokens",
                                       "--model", "splade-tiny", "capital of korea"]))
    assert tokens[0]["_id"] == "d3"
    hybrid = _json(runner.invoke(cli, ["search", "--index", "docs", "--backend", "elasticsearch", "--mode", "hybrid",
                                       "--model-id", "ko-ep", "--size", "3", "capital of korea"]))
    assert {h["_id"] for h in hybrid} <= set(CORPUS) and hybrid[0]["_score"] <= 2 / 61
    ds = tmp_path / "ds"
    (ds / "qrels").mkdir(parents=True)
    (ds / "corpus.jsonl").write_text(corpus.read_text(encoding="utf-8"), encoding="utf-8")
    (ds / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "capital of korea"}) + "\n", encoding="utf-8")
    (ds / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td3\t1\n", encoding="utf-8")
    ev = _json(runner.invoke(cli, ["eval", "--dataset", str(ds), "--model", "splade-tiny", "--backend", "elasticsearch",
                                   "--index", "docs", "--query-mode", "model", "--model-id", "ko-ep",
                                   "--out", str(tmp_path / "eval")]))
    assert ev["metrics"]["mrr@10"] == 1.0 and (tmp_path / "eval" / "run.json").is_file()
    assert es_double.violations == []


def test_connection_errors_are_one_sentence(monkeypatch, es_bundle):
    monkeypatch.delenv("ELASTICSEARCH_URL", raising=False)
    monkeypatch.delenv("OPENSEARCH_URL", raising=False)
    res = CliRunner().invoke(cli, ["deploy-model", str(es_bundle), "--backend", "elasticsearch"])
    assert res.exit_code != 0 and "needs --url" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["deploy-model", str(es_bundle), "--api-key", "abc", "--url", "http://x:9200"])
    assert res.exit_code != 0 and "add --backend elasticsearch" in res.output
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = CliRunner().invoke(cli, ["deploy-model", str(es_bundle), "--backend", "elasticsearch", "--url",
                                   f"http://elastic:pw@127.0.0.1:{port}", "--max-retries", "0"])
    assert res.exit_code != 0 and "did not reach the cluster" in res.output and "Traceback" not in res.output
    assert ":pw@" not in res.output
    secret = "s3cr3t-key"
    res = CliRunner().invoke(cli, ["deploy-model", str(es_bundle), "--backend", "elasticsearch", "--url", "ftp://x",
                                   "--api-key", secret])
    assert res.exit_code != 0 and secret not in res.output


def test_index_engine_ray_on_elasticsearch_hands_the_actors_a_picklable_writer_factory(es_double, tmp_path,
                                                                                      monkeypatch):
    """`--backend elasticsearch --engine ray` used to run the single-process job silently, then was refused;
    it now reaches run_ray_index_job with a factory each actor calls to build its own client and writer."""
    import pickle

    from opensearch_lsr.elasticsearch.bulk import EsDocumentWriter, EsWriterFactory
    from opensearch_lsr.elasticsearch.client import make_es_client
    from opensearch_lsr.elasticsearch.engine import ElasticsearchEngine
    from opensearch_lsr.encoding import ray_job

    seen = {}

    def fake_ray_job(config, options, **kw):
        seen.update(config=config, options=options, **kw)
        return {"indexed": 0}

    monkeypatch.setattr(ray_job, "run_ray_index_job", fake_ray_job)
    monkeypatch.delenv("ELASTICSEARCH_URL", raising=False)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "1", "text": "a"}\n', encoding="utf-8")
    args = ["index", "--backend", "elasticsearch", "--corpus", str(corpus), "--model", "splade-tiny", "--index", "docs",
            "--url", es_double.url, "--no-progress"]
    out = _json(CliRunner().invoke(cli, args + ["--engine", "ray", "--workers", "2", "--cpus-per-worker", "1"]))
    assert out["backend"] == "elasticsearch"
    assert seen["options"].workers == 2 and seen["config"].index == "docs"
    factory = pickle.loads(pickle.dumps(seen["writer_factory"]))   # what Ray ships to each actor
    assert isinstance(factory, EsWriterFactory) and factory.connection["url"] == es_double.url
    ElasticsearchEngine(make_es_client(es_double.url)).create_index("docs")
    writer = factory()
    assert isinstance(writer, EsDocumentWriter)
    outcomes = writer.write([{"_index": "docs", "_id": "x1", "_source": {"text": "a", "sparse_embedding": {"a.b": 1.5}}}])
    assert [o.ok for o in outcomes] == [True]
    client = make_es_client(es_double.url)
    client.indices.refresh(index="docs")
    assert client.count(index="docs")["count"] == 1
    assert es_double.violations == []
    refused = CliRunner().invoke(cli, args + ["--workers", "2"])          # Ray options without --engine ray
    assert refused.exit_code != 0 and "--workers only applies with --engine ray" in refused.output

def test_index_on_elasticsearch_hands_the_job_its_window_and_checkpoint_interval(es_double, tmp_path, monkeypatch):
    """The Elasticsearch route read --window-docs and --checkpoint-interval; the job gets what was typed."""
    from opensearch_lsr.encoding import job

    seen = []
    monkeypatch.setattr(job, "run_index_job", lambda config, **kw: seen.append(config) or {"indexed": 0})
    monkeypatch.delenv("ELASTICSEARCH_URL", raising=False)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "1", "text": "a"}\n', encoding="utf-8")
    args = ["index", "--backend", "elasticsearch", "--corpus", str(corpus), "--model", "splade-tiny", "--index", "docs",
            "--url", es_double.url, "--no-progress"]
    _json(CliRunner().invoke(cli, args))
    _json(CliRunner().invoke(cli, args + ["--window-docs", "1024", "--checkpoint-interval", "0"]))
    assert [(c.window_docs, c.checkpoint_interval_s) for c in seen] == [(4096, 1.0), (1024, 0.0)]


def test_options_the_chosen_cluster_kind_would_drop_are_refused(es_bundle, tmp_path):
    """Nothing typed is dropped in silence: another route's options are one sentence, before any connection."""
    url = ["--url", "http://127.0.0.1:9"]  # never reached: the refusal comes first
    (tmp_path / "c.jsonl").write_text('{"_id": "d1", "text": "seoul"}\n')
    es = ["--backend", "elasticsearch", *url]
    cases = [  # (arguments, what the refusal names)
        (["search", "seoul", "--index", "idx", *es, "--filter", "lang=ko", "--ann-k", "10"], "--ann-k, --filter do not apply"),
        (["search", "seoul", "--index", "idx", *es, "--mode", "hybrid", "--technique", "min_max"], "--technique does not apply"),
        (["eval", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), *es, "--weights", "0.3,0.7"],
         "--weights does not apply"),
        (["eval", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), *es, "--hybrid", "min_max"],
         "--hybrid rrf, not min_max"),
        (["eval", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), *es, "--query-mode", "model"],
         "--query-mode model needs --model-id"),
        (["deploy-model", str(es_bundle), *es, "--which", "encoding"], "--which does not apply"),
        (["deploy-model", str(es_bundle), *url, "--replace", "--model-id", "m"],
         "--model-id, --replace are Elasticsearch options: add --backend elasticsearch"),
        (["create-index", "idx", *es, "--vocab-size", "30522"], "--vocab-size does not apply"),
        (["create-index", "idx", *url, "--prune-tokens"], "--prune-tokens is an Elasticsearch option"),
        (["create-pipeline", "ingest", "p", *es, "--model-id", "m", "--batch-size", "8"], "--batch-size does not apply"),
        (["export", "splade-tiny", "--out", str(tmp_path / "x"), "--target", "elasticsearch", "--name", "n"],
         "--name does not apply with --target elasticsearch or both"),
        (["export", "splade-tiny", "--out", str(tmp_path / "x"), "--es-model-id", "m"],
         "--es-model-id is an Elasticsearch option: add --target elasticsearch or both"),
        (["index", "--corpus", str(tmp_path / "c.jsonl"), "--model", "splade-tiny", "--index", "idx", *es,
          "--aws-region", "us-east-1"], "--aws-region does not apply"),
    ]
    for args, named in cases:
        res = CliRunner().invoke(cli, args)
        assert res.exit_code != 0 and named in res.output and "Traceback" not in res.output, (args, res.output)
    assert not (tmp_path / "x").exists() and not (tmp_path / "o").exists()
