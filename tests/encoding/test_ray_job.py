"""``lsr-os index --engine ray``: same documents and counts as the single-process job, a killed worker,
a stopped and re-run job, bad input, and the sinks (NDJSON, local, OpenSearch double, fake ``_bulk``).

One local Ray cluster (2 CPUs) for the module; the model is the 1-layer test model, so the time is
Ray's start-up and the actors' (torch import, one model load each).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from opensearch_lsr.encoding.documents import doc_id_for  # noqa: E402
from opensearch_lsr.encoding.job import IndexJobConfig, IndexJobError, run_index_job  # noqa: E402
from opensearch_lsr.encoding.ray_job import LEDGER, RayOptions, run_ray_index_job  # noqa: E402
from opensearch_lsr.encoding.writers import read_ndjson_documents  # noqa: E402
from opensearch_lsr.encoding.ray_workers import BlockEncoder  # noqa: E402

WORDS = ["house", "cat", "dog", "capital", "city", "paris", "france", "seoul", "korea", "water", "river"]


def _text(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 6)) + f" {i}"


def _corpus(path: Path, n: int) -> tuple[Path, set[str]]:
    """``n`` documents plus bad input: a malformed line, a duplicate id, an empty text, a blank line,
    a document without an id (sha1 id)."""
    lines = [json.dumps({"_id": f"d{i}", "title": "", "text": _text(i)}) for i in range(n)]
    lines.insert(3, "{broken json")
    lines.insert(8, json.dumps({"_id": "d1", "text": "duplicate of d1"}))
    lines.insert(12, json.dumps({"_id": "empty", "text": " "}))
    lines.insert(20, "")
    lines.append(json.dumps({"text": "a document without id"}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, {f"d{i}" for i in range(n)} | {doc_id_for(None, "a document without id")}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


COUNTS = ("indexed", "dead_lettered", "skipped", "truncated", "generated_ids", "utf8_replaced")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_source_dir):
    """The single-process job's NDJSON output, summary and skipped report on the shared corpus."""
    tmp = tmp_path_factory.mktemp("single")
    corpus, valid = _corpus(tmp / "c.jsonl", 45)
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson", index=str(tmp / "out"),
                         chunk_docs=8, batch_size=4)
    summary = run_index_job(cfg, progress=False)
    docs, n = read_ndjson_documents(tmp / "out")
    assert n == len(docs) == len(valid)
    return {"corpus": corpus, "valid": valid, "summary": summary, "docs": docs,
            "skipped": Path(summary["skipped_file"]).read_text(encoding="utf-8")}


def _config(reference, tmp_path, backend: str, index: str, **kw) -> IndexJobConfig:
    return IndexJobConfig(corpus=str(reference["corpus"]), model=str(kw.pop("model")), backend=backend,
                          index=index, chunk_docs=8, batch_size=4, **kw)


def test_shutdown_waits_for_ray_datas_block_prefetcher_threads():
    """Ray quick-exits the driver when a ``Prefetcher`` thread calls ``ray.wait`` after ``ray.shutdown()``: the job
    joins those threads first, and gives up on one that never ends."""
    import threading
    import time

    from opensearch_lsr.encoding.ray_job import _join_block_prefetchers

    finished = threading.Event()
    waking = threading.Thread(target=lambda: (time.sleep(0.3), finished.set()), name="Prefetcher", daemon=True)
    parked = threading.Thread(target=threading.Event().wait, name="Prefetcher", daemon=True)
    other = threading.Thread(target=threading.Event().wait, name="not-a-prefetcher", daemon=True)
    for thread in (waking, parked, other):
        thread.start()
    t0 = time.monotonic()
    _join_block_prefetchers(timeout_s=1.0)
    assert finished.is_set() and not waking.is_alive()
    assert 0.9 <= time.monotonic() - t0 < 3.0 and parked.is_alive()  # waited for the parked one up to the limit


@pytest.mark.slow  # three Ray start-ups in a fresh process
def test_a_stopped_job_that_started_ray_raises_instead_of_exiting_the_process(tmp_path, tiny_source_dir):
    """Stopped after its first block, a job that started Ray itself shuts Ray down and raises; before the job
    joined Ray Data's prefetcher threads, 2 of 4 such runs ended the process with status 1 and nothing printed."""
    import subprocess

    corpus, _ = _corpus(tmp_path / "c.jsonl", 24)
    script = f"""
from opensearch_lsr.encoding.job import IndexJobConfig
from opensearch_lsr.encoding.ray_job import RayOptions, run_ray_index_job
class Stop(Exception): pass
def stop(block): raise Stop()
for run in range(3):
    cfg = IndexJobConfig(corpus={str(corpus)!r}, model={str(tiny_source_dir)!r}, backend="ndjson",
                         index={str(tmp_path / "out")!r} + str(run), chunk_docs=8, batch_size=4, threads=1)
    try:
        run_ray_index_job(cfg, RayOptions(workers=2, calls_per_worker=1), progress=False, on_block=stop)
    except Stop:
        print("stopped", run, flush=True)
"""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    stops = [line for line in done.stdout.splitlines() if line.startswith("stopped")]  # Ray logs to stdout too
    assert done.returncode == 0 and stops == ["stopped 0", "stopped 1", "stopped 2"], done.stderr[-2000:]


@pytest.mark.parametrize("bad", [{"workers": 0}, {"calls_per_worker": 0}, {"cpus_per_worker": -1}, {"max_restarts": -1}])
def test_ray_options_refuse_impossible_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RayOptions(**bad)


def test_a_failed_ray_job_names_the_exception_that_stopped_the_worker():
    """Ray's errors carry the worker's traceback as text, coloured: the job's one line gives its last exception."""
    from opensearch_lsr.encoding.ray_job import ray_failure_reason

    class ActorDied(Exception):
        error_msg = ("The actor died because of an error raised in its creation task, \x1b[36mray::MapWorker("
                     "MapBatches(BlockEncoder)).__init__()\x1b[39m (pid=1)\n  File \"x.py\", line 3, in f\n"
                     "    raise ValueError(f'model {m!r} has no loadable masked-LM weights: {err}') from err\n"
                     "ValueError: model 'm' has no loadable masked-LM weights: no model.safetensors")

    wrapped = RuntimeError("SystemException")
    wrapped.__cause__ = ActorDied("The actor died because of an error raised in its creation task")
    reason = "ValueError: model 'm' has no loadable masked-LM weights: no model.safetensors"
    assert ray_failure_reason(wrapped) == reason
    assert ray_failure_reason(RuntimeError("\x1b[31mobject store full\x1b[0m\nmore")) == "object store full"


def test_a_ray_ledger_is_resumed_only_with_the_same_document_settings(tmp_path):
    import dataclasses

    from opensearch_lsr.encoding.ray_job import _prepare_work

    work = tmp_path / "w"
    work.mkdir()
    cfg = IndexJobConfig(corpus="c.jsonl", model="m", backend="ndjson", index=str(tmp_path / "out"))
    cfg.save(work)
    (work / LEDGER).write_text("")
    with pytest.raises(IndexJobError, match="was run with key_format 'word', now 'token_id'"):
        _prepare_work(dataclasses.replace(cfg, key_format="token_id"), RayOptions(), work, resume=True, restart=False)
    with pytest.raises(IndexJobError, match="another job .chunk_docs"):  # the block plan
        _prepare_work(dataclasses.replace(cfg, chunk_docs=7), RayOptions(), work, resume=True, restart=False)
    _prepare_work(dataclasses.replace(cfg, precision="bf16"), RayOptions(workers=3), work, resume=True, restart=False)


def test_local_backend_single_writer_same_documents(reference, tmp_path, tiny_source_dir):
    from opensearch_lsr.local.index import LocalIndex

    cfg = _config(reference, tmp_path, "local", str(tmp_path / "idx"), model=tiny_source_dir)
    summary = run_ray_index_job(cfg, RayOptions(workers=1), progress=False)
    assert summary["indexed"] == len(reference["valid"]) and summary["dead_lettered"] == 0
    assert summary["encoder"]["batching"] == "auto" and summary["encoder"]["compile"] is None  # what the actors got
    idx = LocalIndex.open(tmp_path / "idx")
    idx.refresh()
    assert idx.count() == len(reference["valid"])
    hits = idx.search({"query": {"match_all": {}}, "size": 100})["hits"]["hits"]
    got = {h["_id"]: h["_source"] for h in hits}
    assert set(got) == reference["valid"]
    ref = reference["docs"]
    for did, src in got.items():  # stored sources: same text and same keys (weights are stored 9-bit)
        assert src["text"] == ref[did]["text"] and set(src["sparse_embedding"]) == set(ref[did]["sparse_embedding"])


def test_actors_open_the_encoder_with_the_jobs_batching_settings(reference, tmp_path, tiny_source_dir):
    """--batching, --max-batch-tokens and --compile reach every actor's encoder, as --engine single passes them;
    with an ONNX runtime (count-based batches) they are refused, not ignored."""
    from dataclasses import replace

    from opensearch_lsr.encoding.ray_job import actor_encoder_kwargs

    cfg = _config(reference, tmp_path, "ndjson", str(tmp_path / "o"), model=tiny_source_dir, batching="packed",
                  max_batch_tokens=2048, compile=False)
    actor = BlockEncoder(str(tiny_source_dir), encoder_kwargs=actor_encoder_kwargs(cfg, RayOptions()), builder_kwargs={})
    assert actor.encoder.batching == "packed" and actor.encoder.runner.max_batch_tokens == 2048
    assert not actor.encoder.runner.model.compiled
    padded = replace(cfg, batching="padded", max_batch_tokens=None)
    actor = BlockEncoder(str(tiny_source_dir), encoder_kwargs=actor_encoder_kwargs(padded, RayOptions()),
                         builder_kwargs={})
    assert actor.encoder.batching == "padded" and actor.encoder.runner is None
    onnx = _config(reference, tmp_path, "ndjson", str(tmp_path / "o"), model=tiny_source_dir, encoder_runtime="onnx")
    assert "batching" not in actor_encoder_kwargs(onnx, RayOptions())
    with pytest.raises(ValueError, match="apply to encoder_runtime torch"):
        replace(onnx, compile="body")
    # the actors' device is Ray's to give (--num-gpus-per-worker): a --device saying otherwise is refused up front
    assert actor_encoder_kwargs(replace(cfg, device="cpu"), RayOptions())["device"] == "cpu"
    with pytest.raises(IndexJobError, match="--num-gpus-per-worker 0 means cpu, so --device cuda cannot apply"):
        run_ray_index_job(replace(cfg, device="cuda"), RayOptions(), progress=False)
    assert not (tmp_path / "o.job").exists()


def _crash_once(marker: Path) -> type:
    """A :class:`BlockEncoder` whose first write anywhere is followed by ``os._exit`` (once: marker file)."""

    class CrashAfterFirstWrite(BlockEncoder):
        def _write(self, block, first_position, actions):
            outcomes = super()._write(block, first_position, actions)
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return outcomes
            os.write(fd, f"{os.getpid()} {block}".encode())
            os.close(fd)
            os._exit(1)  # the actor process dies after its _bulk was acknowledged, before returning

    return CrashAfterFirstWrite


def test_killed_worker_is_retried_nothing_lost_or_duplicated(reference, tmp_path, tiny_source_dir, fake_bulk):
    from opensearch_lsr.opensearch.client import make_client

    fail_ids = {"d5", "d30"}
    target = fake_bulk(fail_ids=fail_ids, flaky_ids={"d17"})
    url = target.url
    cfg = _config(reference, tmp_path, "opensearch", "idx", model=tiny_source_dir, work_dir=str(tmp_path / "w"))
    marker = tmp_path / "crashed"
    summary = run_ray_index_job(cfg, RayOptions(workers=1), client_factory=lambda: make_client(url),
                                actor_class=_crash_once(marker), progress=False)
    assert marker.exists()                                           # an actor did die mid-run
    valid = reference["valid"]
    assert set(target.docs) == valid - fail_ids                      # nothing lost
    assert max(target.writes.values()) == 2                          # the killed block was written again ...
    assert summary["indexed"] == len(valid) - len(fail_ids)          # ... and counted once
    assert summary["dead_lettered"] == len(fail_ids)
    dead = [json.loads(line) for line in Path(summary["dead_letter_file"]).read_text().splitlines()]
    assert sorted(d["_id"] for d in dead) == sorted(fail_ids)       # dead letters exact, no duplicates
    assert {d["source"] for d in dead} == {"c.jsonl:7", "c.jsonl:35"}
    assert all(d["status"] == 400 and "injected failure" in d["reason"] for d in dead)
    assert target.docs["d0"] == reference["docs"]["d0"]


class _Stop(Exception):
    pass


def test_ndjson_stopped_and_rerun_same_documents_counts_and_reports_as_single_process(reference, tmp_path,
                                                                                    tiny_source_dir):
    """2 workers taking one block at a time, stopped after 2 blocks; the re-run (CLI, --resume, three blocks at
    once) skips them; the result is the single-process job's: same documents (ids, texts, weights),
    counts, skipped report (file:line)."""
    cfg = _config(reference, tmp_path, "ndjson", str(tmp_path / "out"), model=tiny_source_dir)
    done: list[int] = []

    def stop_after_two(block: int) -> None:
        done.append(block)
        if len(done) == 2:
            raise _Stop()

    with pytest.raises(_Stop):
        run_ray_index_job(cfg, RayOptions(workers=2, calls_per_worker=1), progress=False, on_block=stop_after_two)
    ledger = [json.loads(line) for line in (tmp_path / "out.job" / LEDGER).read_text().splitlines()]
    assert sorted(e["block"] for e in ledger) == sorted(done)
    with pytest.raises(IndexJobError, match="--resume"):            # a ledger is not silently overwritten
        run_ray_index_job(cfg, RayOptions(workers=2), progress=False)
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    args = ["index", "--corpus", str(reference["corpus"]), "--model", str(tiny_source_dir), "--backend", "ndjson",
            "--index", str(tmp_path / "out"), "--chunk-docs", "8", "--batch-size", "4", "--no-progress"]
    refused = CliRunner().invoke(cli, [*args, "--workers", "2", "--calls-per-worker", "1"])
    assert refused.exit_code != 0 and "--workers, --calls-per-worker only apply with --engine ray" in refused.output
    refused = CliRunner().invoke(cli, [*args, "--engine", "ray", "--calls-per-worker", "0", "--resume"])
    assert refused.exit_code != 0 and "calls_per_worker must be >= 1" in refused.output
    refused = CliRunner().invoke(cli, [*args, "--engine", "ray", "--build-workers", "2", "--resume"])
    assert refused.exit_code != 0 and "--build-workers applies to --engine single" in refused.output
    res = CliRunner().invoke(cli, [*args, "--engine", "ray", "--workers", "1", "--calls-per-worker", "3", "--resume"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "out.job" / "ray_job.json").read_text())["calls_per_worker"] == 3
    again = json.loads(res.stdout)
    assert again["ray"]["calls_per_worker"] == 3 and again["ray"]["workers"] == 1  # what this run got
    assert again["blocks"] == {"total": 6, "done_before": 2, "this_run": 4, "docs_per_block": 8}
    first_two = sum(e["counters"]["indexed"] for e in ledger)
    assert again["this_run"]["indexed"] == len(reference["valid"]) - first_two
    docs, n = read_ndjson_documents(tmp_path / "out")
    assert n == len(docs) == len(reference["valid"])                # nothing lost, nothing duplicated
    assert docs == reference["docs"]                                 # identical ids, texts and weights
    assert {k: again[k] for k in COUNTS} == {k: reference["summary"][k] for k in COUNTS}
    assert again["skipped"] == {"blank_line": 1, "duplicate_id": 1, "empty_text": 1, "malformed": 1}
    skipped = Path(again["skipped_file"]).read_text(encoding="utf-8")
    assert skipped == reference["skipped"]                           # same report, file:line, same order
    assert [(r["source"], r["reason"]) for r in map(json.loads, skipped.splitlines())] == [
        ("c.jsonl:4", "malformed"), ("c.jsonl:9", "duplicate_id"), ("c.jsonl:13", "empty_text")]
    finished = run_ray_index_job(cfg, RayOptions(workers=1), resume=True, progress=False)
    assert finished["blocks"]["this_run"] == 0 and finished["indexed"] == len(reference["valid"])


def test_opensearch_double_sink(reference, tmp_path, tiny_source_dir):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensearch"))
    from double.fixtures import make_double

    from opensearch_lsr.encoding.documents import flat_mapping
    from opensearch_lsr.opensearch.client import make_client

    double = make_double("3.3.0")
    try:
        url = double.url
        make_client(url).indices.create(index="ray-idx", body={"mappings": flat_mapping(text_analyzer=None)})
        cfg = _config(reference, tmp_path, "opensearch", "ray-idx", model=tiny_source_dir,
                      work_dir=str(tmp_path / "w"))
        summary = run_ray_index_job(cfg, RayOptions(workers=1), client_factory=lambda: make_client(url),
                                    progress=False)
        client = make_client(url)
        client.indices.refresh(index="ray-idx")
        assert summary["indexed"] == len(reference["valid"]) == client.count(index="ray-idx")["count"]
        got = client.get(index="ray-idx", id="d3")["_source"]
        assert got["text"] == reference["docs"]["d3"]["text"]
        assert double.violations == []
    finally:
        double.stop()


@pytest.mark.slow  # two `lsr-os index --engine ray` driver processes on the module's cluster
def test_driver_sigkill_then_resume_exactly_once(reference, tmp_path, tiny_source_dir, fake_bulk):
    """kill -9 of the whole driver mid-run (its actors die with it), then --resume on the same cluster
    (--address): every valid document indexed once, dead letters exactly the rejected ones."""
    import signal
    import subprocess
    import time

    fail_ids = {"d5", "d30"}
    target = fake_bulk(fail_ids=fail_ids, delay=0.5)
    work = tmp_path / "w"
    address = ray.get_runtime_context().gcs_address
    args = [sys.executable, "-c", "from opensearch_lsr.cli import main; main()", "index", "--engine", "ray",
            "--address", address, "--workers", "1", "--corpus", str(reference["corpus"]), "--model",
            str(tiny_source_dir), "--backend", "opensearch", "--index", "idx", "--url", target.url, "--work-dir",
            str(work), "--chunk-docs", "8", "--batch-size", "4", "--no-progress"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    ledger = work / LEDGER
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"job ended before the kill: {proc.communicate()}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = len(ledger.read_text().splitlines())
    assert 2 <= before < 6
    target.delay = 0.0
    again = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    valid = reference["valid"]
    assert summary["blocks"]["done_before"] == before
    assert set(target.docs) == valid - fail_ids                      # nothing lost
    assert summary["indexed"] == len(valid) - len(fail_ids) and summary["dead_lettered"] == len(fail_ids)
    dead = [json.loads(line) for line in (work / "dead_letter.jsonl").read_text().splitlines()]
    assert sorted(d["_id"] for d in dead) == sorted(fail_ids)       # no duplicate dead letters
    assert target.docs == {k: v for k, v in reference["docs"].items() if k not in fail_ids}


@pytest.mark.slow  # one more Ray run; the OpenSearch double test covers a cluster sink in the default suite
def test_elasticsearch_double_sink_with_a_writer_factory(reference, tmp_path, tiny_source_dir):
    """Any DocumentWriter runs on the actors through ``writer_factory`` (here Elasticsearch's, whose
    client is built on each actor); a rejected document is dead-lettered with its file:line."""
    pytest.importorskip("elasticsearch")
    import importlib.util

    double_dir = Path(__file__).resolve().parents[1] / "elasticsearch" / "double"
    if "es_double" not in sys.modules:  # as tests/elasticsearch/conftest.py loads it
        spec = importlib.util.spec_from_file_location("es_double", double_dir / "__init__.py",
                                                      submodule_search_locations=[str(double_dir)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["es_double"] = module
        spec.loader.exec_module(module)
    from es_double import ElasticsearchDouble

    from opensearch_lsr.elasticsearch.bulk import EsWriterFactory
    from opensearch_lsr.elasticsearch.client import make_es_client
    from opensearch_lsr.elasticsearch.engine import ElasticsearchEngine

    double = ElasticsearchDouble().start()
    try:
        url = double.url
        ElasticsearchEngine(make_es_client(url)).create_index("docs")
        double.reject_item_ids["d3"] = (400, "document_parsing_exception", "failed to parse field [text]")
        cfg = _config(reference, tmp_path, "opensearch", "docs", model=tiny_source_dir, work_dir=str(tmp_path / "w"))
        summary = run_ray_index_job(
            cfg, RayOptions(workers=1), progress=False,
            writer_factory=EsWriterFactory({"url": url, "max_retries": 1}, "docs"))  # what `lsr-os index` passes
        assert summary["indexed"] == len(reference["valid"]) - 1 and summary["dead_lettered"] == 1
        dead = [json.loads(line) for line in Path(summary["dead_letter_file"]).read_text().splitlines()]
        assert [(d["_id"], d["source"]) for d in dead] == [("d3", "c.jsonl:5")] and "failed to parse" in dead[0]["reason"]
        assert make_es_client(url).count(index="docs")["count"] == len(reference["valid"]) - 1
        assert double.violations == []
    finally:
        double.stop()
