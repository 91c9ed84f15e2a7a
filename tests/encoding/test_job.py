from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opensearch_lsr.encoding.documents import doc_id_for
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.job import IndexJobConfig, IndexJobError, run_index_job
from opensearch_lsr.encoding.writers import NdjsonWriter, read_ndjson_documents

WORDS = ["house", "cat", "dog", "capital", "city", "paris", "france", "seoul", "korea", "water", "river"]


def _text(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 6)) + f" {i}"


def _corpus(path: Path, n: int, bad: bool = True) -> tuple[Path, set[str]]:
    lines = [json.dumps({"_id": f"d{i}", "title": "", "text": _text(i)}) for i in range(n)]
    valid = {f"d{i}" for i in range(n)}
    if bad:
        lines.insert(3, "{broken json")                                     # malformed
        lines.insert(8, json.dumps({"_id": "d1", "text": "duplicate of d1"}))  # duplicate id
        lines.insert(12, json.dumps({"_id": "empty", "text": " "}))          # empty text
        lines.append(json.dumps({"text": "a document without id"}))        # sha1 id
        valid.add(doc_id_for(None, "a document without id"))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, valid


@pytest.fixture(scope="module")
def tiny_encoder(tiny_source_dir):
    return SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=8)


def test_local_backend_summary_reports_and_ids(tmp_path, tiny_source_dir, tiny_encoder):
    from opensearch_lsr.local.index import LocalIndex

    corpus, valid = _corpus(tmp_path / "c.jsonl", 30)
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="local",
                         index=str(tmp_path / "idx"), chunk_docs=7)
    summary = run_index_job(cfg, encoder=tiny_encoder, progress=False)
    assert summary["indexed"] == len(valid) == 31 and summary["dead_lettered"] == 0
    assert summary["skipped"] == {"duplicate_id": 1, "empty_text": 1, "malformed": 1}
    assert summary["generated_ids"] == 1 and summary["peak_rss_mb"] > 0
    idx = LocalIndex.open(tmp_path / "idx")
    idx.refresh()
    assert idx.count() == 31
    reports = [json.loads(l) for l in Path(summary["skipped_file"]).read_text().splitlines()]
    assert [(r["source"], r["reason"]) for r in reports] == [
        ("c.jsonl:4", "malformed"), ("c.jsonl:9", "duplicate_id"), ("c.jsonl:13", "empty_text")]
    assert "c.jsonl:2" in reports[1]["detail"]  # where d1 was first seen
    hits = idx.search({"query": {"neural_sparse": {"sparse_embedding": {"query_tokens": {k: 1.0 for k in set(tiny_encoder.keys) if k}}}},
                       "size": 100})["hits"]["hits"]
    assert hits and all(h["_id"] in valid for h in hits)
    # a stale checkpoint is refused without --resume/--restart; --restart rebuilds the same ids
    with pytest.raises(IndexJobError, match="--resume"):
        run_index_job(cfg, encoder=tiny_encoder, progress=False)
    again = run_index_job(cfg, encoder=tiny_encoder, restart=True, progress=False)
    assert again["indexed"] == 31 and idx.count() == 31


class _CrashingWriter(NdjsonWriter):
    def __init__(self, *a, crash_after: int, **kw):
        super().__init__(*a, **kw)
        self.calls, self.crash_after = 0, crash_after

    def write(self, actions):
        self.calls += 1
        if self.calls > self.crash_after:
            raise RuntimeError("simulated crash")
        return super().write(actions)


def test_ndjson_resume_truncates_and_never_duplicates(tmp_path, tiny_source_dir, tiny_encoder):
    corpus, valid = _corpus(tmp_path / "c.jsonl", 40)
    out = tmp_path / "bulk"
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(out),
                         chunk_docs=6, ndjson_docs_per_file=10)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_index_job(cfg, encoder=tiny_encoder, writer=_CrashingWriter(out, "bulk", crash_after=3,
                                                                       docs_per_file=10), progress=False)
    # bytes written after the last checkpoint (a half-written chunk) are cut on resume
    with open(out / "bulk-00001.ndjson", "ab") as fh:
        fh.write(b'{"index": {"_id": "garbage"}}\n')
    summary = run_index_job(cfg, encoder=tiny_encoder, resume=True, progress=False)
    ids = []
    for f in sorted(out.glob("bulk-*.ndjson")):
        lines = f.read_text().splitlines()
        assert len(lines) <= 20
        ids += [json.loads(m)["index"]["_id"] for m in lines[::2]]
    assert sorted(ids) == sorted(valid) and summary["indexed"] == len(valid)
    assert summary["skipped"] == {"duplicate_id": 1, "empty_text": 1, "malformed": 1}


class _SlowFirstWriter(_CrashingWriter):
    """Its first write waits, so the chunks after it queue up behind the writer."""

    def write(self, actions):
        if self.calls == 0:
            time.sleep(1.5)
        return super().write(actions)


@pytest.mark.parametrize("interval", [0.0, 60.0])
def test_a_writer_behind_checkpoints_less_often_and_a_resume_still_writes_each_document_once(
        tmp_path, tiny_source_dir, tiny_encoder, monkeypatch, interval):
    from opensearch_lsr.encoding.job import IndexJob

    saved = []
    save = IndexJob._save_checkpoint
    monkeypatch.setattr(IndexJob, "_save_checkpoint", lambda self, progress, done=False: (
        saved.append((progress.position, done)), save(self, progress, done))[-1])
    corpus, valid = _corpus(tmp_path / "c.jsonl", 60)
    out = tmp_path / "bulk"
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(out),
                         chunk_docs=6, ndjson_docs_per_file=10, checkpoint_interval_s=interval)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_index_job(cfg, encoder=tiny_encoder, writer=_SlowFirstWriter(out, "bulk", crash_after=6, docs_per_file=10),
                      progress=False)
    if interval:  # chunks 2-6 were queued behind the first write: only the first of them is checkpointed
        assert len(saved) < 6 and saved[0][0] > 0
    else:
        assert len(saved) == 6
    summary = run_index_job(cfg, encoder=tiny_encoder, resume=True, progress=False)
    docs, n = read_ndjson_documents(out)
    assert set(docs) == valid and n == len(valid) == summary["indexed"]
    assert summary["this_run"]["checkpoint_s"] >= 0 and summary["this_run"]["duplicates_s"] > 0


def test_ndjson_files_of_an_earlier_run_are_replaced_on_restart_and_refused_otherwise(tmp_path, tiny_source_dir,
                                                                                      tiny_encoder):
    """A run with no checkpoint to continue from never appends to an earlier run's files: that would leave two runs'
    documents in one index's bulk files."""
    import shutil

    corpus, valid = _corpus(tmp_path / "c.jsonl", 25)
    out = tmp_path / "bulk"
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(out),
                         chunk_docs=6, ndjson_docs_per_file=10)
    first = run_index_job(cfg, encoder=tiny_encoder, progress=False)
    written = {f.name: f.read_bytes() for f in out.glob("bulk-*.ndjson")}
    assert len(written) == 3 and read_ndjson_documents(out)[1] == len(valid)
    again = run_index_job(cfg, encoder=tiny_encoder, restart=True, progress=False)
    assert {f.name: f.read_bytes() for f in out.glob("bulk-*.ndjson")} == written  # one run's files, not two
    shutil.rmtree(first["work_dir"])  # the checkpoint gone, the files still there
    with pytest.raises(IndexJobError, match="already holds 3 bulk-.*--restart"):
        run_index_job(cfg, encoder=tiny_encoder, progress=False)
    assert {f.name: f.read_bytes() for f in out.glob("bulk-*.ndjson")} == written  # untouched
    (out / "bulk-00009.ndjson").write_bytes(b"stale\n")
    run_index_job(cfg, encoder=tiny_encoder, restart=True, progress=False)
    assert {f.name: f.read_bytes() for f in out.glob("bulk-*.ndjson")} == written and again["indexed"] == len(valid)


def test_resuming_with_other_document_settings_is_refused(tmp_path, tiny_source_dir, tiny_encoder):
    """A resumed job keeps what decides its documents (model, key format, prune, fields...); speed settings may
    change. Otherwise the index would hold documents of two models or two key formats."""
    import dataclasses

    from opensearch_lsr.encoding.job import IndexJobError

    corpus, _ = _corpus(tmp_path / "c.jsonl", 20)
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(tmp_path / "o"),
                         chunk_docs=4, limit=8)
    first = run_index_job(cfg, encoder=tiny_encoder, progress=False)
    other_model = tmp_path / "other-model"
    other_model.mkdir()
    for changed, match in [({"model": str(other_model)}, "model"), ({"key_format": "token_id"}, "key_format"),
                           ({"prune": "top_k:5"}, "prune"), ({"sparse_field": "vec"}, "sparse_field")]:
        with pytest.raises(IndexJobError, match=f"was run with {match} .*--restart"):
            run_index_job(dataclasses.replace(cfg, **changed), encoder=tiny_encoder, resume=True, progress=False)
    same = dataclasses.replace(cfg, model=str(tiny_source_dir) + "/", batch_size=3, precision="fp32")  # same dir
    assert run_index_job(same, encoder=tiny_encoder, resume=True, progress=False)["indexed"] == first["indexed"] > 0


def test_a_run_stopped_by_limit_goes_on_when_resumed_with_a_larger_one(tmp_path, tiny_source_dir, tiny_encoder):
    """--limit 8, then --resume --limit 14, then --resume without one: every document once, as one run writes."""
    import dataclasses

    corpus, valid = _corpus(tmp_path / "c.jsonl", 20)
    out = tmp_path / "o"
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(out),
                         chunk_docs=4, limit=8)
    counts = [run_index_job(cfg, encoder=tiny_encoder, progress=False)["indexed"]]
    for limit in (14, None, None):  # the last run finds the job complete: nothing more to read
        summary = run_index_job(dataclasses.replace(cfg, limit=limit), encoder=tiny_encoder, resume=True,
                                progress=False)
        counts.append(summary["indexed"])
    assert counts[0] < counts[1] < counts[2] == counts[3] == len(valid) and summary["this_run"]["indexed"] == 0
    lines = "".join(f.read_text() for f in sorted(out.glob("bulk-*.ndjson"))).splitlines()
    assert sorted(json.loads(m)["index"]["_id"] for m in lines[::2]) == sorted(valid)  # none twice, none lost


def test_split_policy_nested_documents(tmp_path, splade_tiny_dir):
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu", batch_size=4)
    long = " ".join(f"seoul{i} korea" for i in range(400))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"_id": "long", "text": long}) + "\n" + json.dumps({"_id": "short", "text": "paris"})
                      + "\n", encoding="utf-8")
    out = tmp_path / "bulk"
    cfg = IndexJobConfig(corpus=str(corpus), model=str(splade_tiny_dir), backend="ndjson", index=str(out),
                         long_text="split")
    summary = run_index_job(cfg, encoder=enc, progress=False)
    assert summary["split_docs"] == 1 and summary["passages"] > 2
    docs = [json.loads(l) for l in (out / "bulk-00000.ndjson").read_text().splitlines()[1::2]]
    long_doc = next(d for d in docs if d["id"] == "long")
    nested = long_doc["sparse_embedding"]
    assert len(nested) == summary["passages"] - 1 and all(set(p) == {"sparse_encoding", "text"} for p in nested)
    assert all(n <= 512 for n in enc.count_tokens([p["text"] for p in nested]))
    with pytest.raises(IndexJobError, match="nested"):
        run_index_job(IndexJobConfig(corpus=str(corpus), model="x", backend="local", index=str(tmp_path / "i"),
                                     long_text="split"), encoder=enc, progress=False)


def _run_cli(args, env=None):
    cmd = [sys.executable, "-c", "from opensearch_lsr.cli import main; main()", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})})


@pytest.mark.slow  # two `lsr-os index` subprocesses (torch import + model load each)
def test_sigkill_then_resume_exactly_once(tmp_path, tiny_source_dir, fake_bulk):
    """kill -9 mid-run, --resume: every valid doc indexed once, dead letters == injected failures."""
    corpus, valid = _corpus(tmp_path / "c.jsonl", 60)
    fail_ids = {"d7", "d33", "d58"}
    target = fake_bulk(fail_ids=fail_ids, flaky_ids={"d12", "d40"}, delay=0.6)
    work = tmp_path / "work"
    args = ["index", "--corpus", str(corpus), "--model", str(tiny_source_dir), "--backend", "opensearch",
            "--index", "test-idx", "--url", target.url, "--work-dir", str(work), "--chunk-docs", "4",
            "--batch-size", "4", "--no-progress", "--threads", "1"]
    proc = _run_cli(args)
    ckpt = work / "checkpoint.json"
    deadline = time.time() + 1200  # a loaded CI machine can take minutes to start
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and json.loads(ckpt.read_text())["position"] >= 12:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"job ended before the kill: {proc.communicate()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = json.loads(ckpt.read_text())
    assert 0 < killed_at["position"] < 64 and not killed_at["done"]
    target.delay = 0.0
    again = subprocess.run([sys.executable, "-c", "from opensearch_lsr.cli import main; main()", *args, "--resume"],
                           capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert set(target.docs) == valid - fail_ids            # nothing lost
    assert len(target.docs) == len(valid) - len(fail_ids)  # no duplicates (keyed by deterministic _id)
    assert summary["indexed"] == len(valid) - len(fail_ids) and summary["dead_lettered"] == len(fail_ids)
    dead = [json.loads(l) for l in (work / "dead_letter.jsonl").read_text().splitlines()]
    assert sorted(d["_id"] for d in dead) == sorted(fail_ids)
    assert all(d["status"] == 400 and "injected failure" in d["reason"] for d in dead)
    assert summary["skipped"] == {"duplicate_id": 1, "empty_text": 1, "malformed": 1}
    assert summary["resumed_from_position"] == killed_at["position"]


def test_opensearch_backend_retries_and_dead_letters(tmp_path, tiny_source_dir, tiny_encoder, fake_bulk):
    from opensearch_lsr.opensearch.client import make_client

    corpus, valid = _corpus(tmp_path / "c.jsonl", 25)
    target = fake_bulk(fail_ids={"d4", "d20"}, flaky_ids={"d9"})
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="opensearch", index="idx",
                         work_dir=str(tmp_path / "w"), chunk_docs=6)
    summary = run_index_job(cfg, encoder=tiny_encoder, client_factory=lambda: make_client(target.url), progress=False)
    assert set(target.docs) == valid - {"d4", "d20"} and target.writes["d9"] == 1  # 429 retried once
    assert summary["indexed"] == len(valid) - 2 and summary["dead_lettered"] == 2
    dead = [json.loads(l) for l in (tmp_path / "w" / "dead_letter.jsonl").read_text().splitlines()]
    assert sorted(d["_id"] for d in dead) == ["d20", "d4"] and {d["source"] for d in dead} <= {"c.jsonl:6", "c.jsonl:24"}
    doc = target.docs["d0"]
    assert set(doc) == {"id", "text", "sparse_embedding"} and all(v > 0 for v in doc["sparse_embedding"].values())


def test_a_job_with_the_body_compiled_writes_what_the_eager_job_writes(tmp_path, tiny_source_dir, monkeypatch):
    """``compile="body"`` (what the CUDA graphs of CUDA's default replay) through a whole job, on CPU in fp32:
    packed batches of many sizes (the shapes the compiled graph meets after its one recompile), the same ids and
    weights as eager."""
    from opensearch_lsr.encoding.packed import CompiledStep

    calls, call = [], CompiledStep.__call__
    monkeypatch.setattr(CompiledStep, "__call__", lambda self, *a: calls.append(self.compiled) or call(self, *a))
    corpus, valid = _corpus(tmp_path / "c.jsonl", 43, bad=False)

    def run(compile_, name: str) -> dict:
        cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", batching="packed",
                             index=str(tmp_path / name), chunk_docs=7, max_batch_tokens=64, compile=compile_)
        summary = run_index_job(cfg, progress=False)
        assert summary["indexed"] == len(valid)
        lines = (tmp_path / name / "bulk-00000.ndjson").read_text().splitlines()
        return {json.loads(m)["index"]["_id"]: json.loads(d)["sparse_embedding"] for m, d in zip(lines[::2], lines[1::2])}

    eager = run(False, "eager")
    assert not calls
    body = run("body", "body")
    assert len(calls) >= 6 and all(calls)  # one compiled call per packed batch, never fallen back to eager
    assert set(eager) == set(body) == valid
    for doc_id, vector in eager.items():
        assert set(vector) == set(body[doc_id]), doc_id
        assert max(abs(w - body[doc_id][k]) for k, w in vector.items()) <= 1e-4


def test_dropped_nonfinite_weights_are_counted_and_warned(tmp_path, tiny_source_dir, caplog):
    """NaN weights never reach the index; the summary counts them and the job warns, with a hint for fp16."""
    import logging

    import torch

    from opensearch_lsr.encoding.job_state import warn_nonfinite

    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=8, batching="padded")
    bad_id = next(i for i, k in enumerate(enc.keys) if k and i not in enc.special_ids)
    with torch.no_grad():
        enc.model.get_output_embeddings().bias[bad_id] = float("nan")
    corpus, valid = _corpus(tmp_path / "c.jsonl", 12, bad=False)
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(tmp_path / "o"))
    with caplog.at_level(logging.WARNING, logger="opensearch_lsr.encoding.job_state"):
        summary = run_index_job(cfg, encoder=enc, progress=False)
    assert summary["indexed"] == len(valid) and summary["encoder"]["nonfinite_dropped"] == len(valid)
    docs = [json.loads(d)["sparse_embedding"] for d in (tmp_path / "o" / "bulk-00000.ndjson").read_text().splitlines()[1::2]]
    assert len(docs) == len(valid) and all(docs) and not any(enc.keys[bad_id] in d for d in docs)
    assert [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()] == [(
        f"{len(valid)} non-finite weights (NaN / inf) left the encoder and were dropped from their documents (summary: "
        "encoder.nonfinite_dropped); the model itself outputs NaN / inf for some texts")]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="opensearch_lsr.encoding.job_state"):
        warn_nonfinite({"nonfinite_dropped": 0, "precision": "fp16"})
        assert not caplog.records
        warn_nonfinite({"nonfinite_dropped": 5, "precision": "fp16"})
    assert "--precision bf16" in caplog.records[0].getMessage()


def test_settings_the_job_would_ignore_are_refused(tmp_path):
    """Options that cannot apply to a configuration are errors, not silently dropped."""
    ndjson = dict(corpus="c.jsonl", model="m", backend="ndjson", index=str(tmp_path / "o"))
    with pytest.raises(ValueError, match="build_workers .* applies to the ndjson backend with long_text truncate"):
        IndexJobConfig(**{**ndjson, "backend": "local"}, build_workers=2)
    with pytest.raises(ValueError, match="here ndjson, split"):
        IndexJobConfig(**ndjson, long_text="split", build_workers=2)
    IndexJobConfig(**{**ndjson, "backend": "local"}, build_workers=0)  # none asked for: nothing to refuse
    IndexJobConfig(**ndjson, build_workers=2)
    for given in ({"batching": "padded"}, {"max_batch_tokens": 8192}, {"compile": "body"}, {"compile": False}):
        with pytest.raises(ValueError, match="apply to encoder_runtime torch; onnx-int8 encodes padded batches"):
            IndexJobConfig(**ndjson, encoder_runtime="onnx-int8", **given)
        IndexJobConfig(**ndjson, **given)


def test_on_a_gpu_the_warm_up_encodes_the_corpus_passages_to_come(tmp_path, tiny_source_dir, monkeypatch):
    """CUDA graphs capture one graph per batch shape: the job warms up on the next passages of its own corpus
    (bad lines left out, from the checkpoint on a resume), so their shapes are captured before the clock."""
    import opensearch_lsr.encoding.job as job_module

    seen = []
    monkeypatch.setattr(job_module, "_packed_on_cuda", lambda encoder: True)
    windows = []
    monkeypatch.setattr(SparseDocumentEncoder, "warm_up", lambda self, *a, **k: seen.append(k.get("sample"))
                        or windows.append(k.get("window_docs")) or 0.0)
    corpus = tmp_path / "c.jsonl"
    lines = [json.dumps({"_id": f"d{i}", "text": f"passage {i} house"}) for i in range(7)]
    lines.insert(2, "{not json")
    corpus.write_text("\n".join(lines) + "\n")
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(tmp_path / "o"),
                         work_dir=str(tmp_path / "w"), batching="packed", window_docs=2, chunk_docs=3, limit=5)
    first = run_index_job(cfg, progress=False)
    assert seen == [[f"passage {i} house" for i in range(4)]]  # 2 * window_docs, the bad line skipped
    assert windows == [2]  # cut in the job's windows, so the warm-up meets the job's batch shapes
    cfg = IndexJobConfig(**{**cfg.__dict__, "limit": None})
    second = run_index_job(cfg, resume=True, progress=False)
    assert seen[1] == [f"passage {i} house" for i in range(4, 7)]  # after the checkpoint (line 5)
    assert first["indexed"] == 4 and second["indexed"] == 7  # the summary counts the whole job
