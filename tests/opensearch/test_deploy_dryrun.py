"""deploy-model --dry-run --requests: the exact request sequence, spec-valid, without a cluster."""
from __future__ import annotations

import hashlib
import json
import re

from click.testing import CliRunner
from double import SpecValidator
from double.fixtures import fake_bundle, make_double

from opensearch_lsr.cli import cli
from opensearch_lsr.opensearch.client import client_from_options
from opensearch_lsr.opensearch.mlcommons import DeployConfig, deploy_bundle


def _run_dry(tmp_path, bundle, *extra):
    out = tmp_path / "requests.ndjson"
    res = CliRunner().invoke(cli, ["deploy-model", str(bundle), "--dry-run", "--requests", str(out),
                                   "--chunk-size", "1000", *extra])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()], json.loads(res.output)


def test_dry_run_writes_every_request_and_each_validates_against_the_spec(tmp_path):
    bundle = fake_bundle(tmp_path / "bundle")
    requests, summary = _run_dry(tmp_path, bundle, "--apply-settings", "--model-group", "lsr",
                                 "--url", "http://127.0.0.1:9")  # never contacted
    assert summary["dry_run"] is True and summary["requests"] == len(requests)
    assert [r["seq"] for r in requests] == list(range(1, len(requests) + 1))
    validator = SpecValidator.shared()
    used: set[str] = set()
    for req in requests:
        body = req.get("body")
        if isinstance(body, dict) and "sha256" in body and "bytes" in body:
            data = (bundle / body["file"]).read_bytes()[body["offset"]:body["offset"] + body["bytes"]]
            assert hashlib.sha256(data).hexdigest() == body["sha256"]  # replayable from the bundle
            raw = data
        else:
            raw = json.dumps(body).encode() if body is not None else None
        result = validator.validate(req["method"], req["path"], req["query"], raw, "application/json")
        assert result.operation, req
        assert result.errors == [], (req["method"], req["path"], result.errors)
        used |= set(result.deviations)
    assert used <= {"upload_chunk_raw_bytes", "sparse_model_without_model_config"}
    chunks = [r for r in requests if "/upload_chunk/" in r["path"]]
    assert sum(c["body"]["bytes"] for c in chunks) == 2500 + 700
    meta = [r for r in requests if r["path"].endswith("/_register_meta")]
    assert [m["body"]["function_name"] for m in meta] == ["SPARSE_ENCODING", "SPARSE_TOKENIZE"]
    assert all(m["body"]["model_group_id"] == "{{model_group.model_group_id}}" for m in meta)


def test_dry_run_equals_the_sequence_a_real_deploy_sends(tmp_path):
    """Same method + path + body sequence as a deploy against the double (ids substituted)."""
    bundle = fake_bundle(tmp_path / "bundle")
    planned, _ = _run_dry(tmp_path, bundle, "--apply-settings")
    double = make_double("3.3.0")
    try:
        client = client_from_options(url=double.url)
        out = deploy_bundle(client, bundle, DeployConfig(apply_settings=True, chunk_size=1000, poll_interval_s=0.01))
        sent = [e for e in double.request_log if e["path"] not in ("/", "/_cat/plugins")]
    finally:
        double.stop()
    ids = {"sparse_encoding": out["sparse_encoding"], "sparse_tokenize": out["sparse_tokenize"]}

    def concrete(path: str) -> str:
        path = re.sub(r"\{\{(\w+)\.model_id\}\}", lambda m: ids[m.group(1)], path)
        return re.sub(r"\{\{\w+\.deploy_task_id\}\}", "<task>", path)

    sent_paths = [(e["method"], re.sub(r"/tasks/\w+$", "/tasks/<task>", e["path"])) for e in sent]
    # the real run polls each task until it completes: compare with repeated polls collapsed
    collapsed = [p for i, p in enumerate(sent_paths) if i == 0 or p != sent_paths[i - 1]]
    assert [(r["method"], concrete(r["path"])) for r in planned] == collapsed


def test_dry_run_refuses_a_cluster_without_sparse_models(tmp_path):
    res = CliRunner().invoke(cli, ["deploy-model", str(fake_bundle(tmp_path / "b")), "--dry-run",
                                   "--cluster-version", "2.10.0"])
    assert res.exit_code == 1 and "2.11 or newer" in res.output and "Traceback" not in res.output


def test_requests_without_dry_run_is_refused(tmp_path):
    res = CliRunner().invoke(cli, ["deploy-model", str(fake_bundle(tmp_path / "b")), "--requests", "x.ndjson"])
    assert res.exit_code != 0 and "only apply with --dry-run" in res.output
