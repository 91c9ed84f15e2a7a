"""``benchmarks/gpu_encode.py`` runs its CPU form end to end (the GPU form is the same code on CUDA)."""
from __future__ import annotations

import json


def test_gpu_encode_benchmark_runs_on_cpu_and_reports_every_row(shared_data, splade_tiny_dir, tmp_path, load_script):
    module = load_script("gpu_encode")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    module.main(["--out", str(out), "--md", str(md), "--data", str(shared_data), "--splade-tiny", str(splade_tiny_dir),
                 "--limit", "24", "--subset", "12", "--skip-reference-model", "--tokenizer-processes", "2x2",
                 "--skip", "packed_other", "segment_max", "budgets", "ndjson", "mrr"])
    result = json.loads(out.read_text())
    (row,) = result["models"]
    assert "errors" not in row, row.get("errors")
    assert row["docs"] == 24 and row["packed"]["padded_share"] == 0.0 and row["reference"]["padded_share"] > 0
    assert row["packed"]["docs_per_s"] > 0 and row["reference"]["docs_per_s"] > 0
    exact = row["exact_packed_fp32_vs_reference_fp32"]
    assert exact["docs"] == 12 and exact["max_abs_dw"] <= 1e-5 and exact["jaccard_mean"] > 0.99
    own = row["reference_fp32_vs_itself_at_a_quarter_batch"]  # the reference's own floor, other batch shapes
    assert own["docs"] == 12 and own["max_abs_dw"] <= 1e-5 and own["jaccard_mean"] > 0.99
    assert 0 < row["fp32_logits_near_zero_per_doc"] < 100  # of 30,522 ids: what lower precisions can flip
    assert set(row["stage_ms_per_batch"]) == {"copy_in", "body", "head_max", "sparsify_copy_out"}
    tok = row["packed_tok2x2"]  # on CPU the encoder tokenizes in a thread: the row runs, the layout is recorded
    assert tok["tokenizer"] == {"processes": 2, "threads": 2} and tok["vs_packed"]["max_abs_dw"] == 0.0
    graphs = row["packed_graphs"]  # the body compiled for CUDA-graph replay (here Inductor's CPU kernels, no graphs)
    assert graphs["compile_scope"] == "graphs" and graphs["vs_packed"]["max_abs_dw"] <= 1e-5
    assert graphs["cuda_graphs"] is None  # graphs are captured on CUDA only
    census = row["graph_buckets"]  # host-only: how the card's budgets would bucket this corpus
    assert {"16384", "32768", "65536"} <= set(census)
    assert all(1 <= c["buckets"] <= c["batches"] and 0 < c["padding_share"] < 0.9 for c in census.values())
    nocache = row["packed_nocache"]  # the default without the tokenizer's word cache: same vectors
    assert nocache["word_cache"] == 0 and nocache["vs_packed"]["max_abs_dw"] == 0.0 and row["packed_over_nocache"] > 0
    assert 0 < row["chunk_repeat_share"] < 1
    from opensearch_lsr.encoding.token_batches import default_max_batch_tokens

    assert row["max_batch_tokens"] == default_max_batch_tokens("cpu")  # the packed rows run the device's default
    text = md.read_text()
    assert f"{default_max_batch_tokens('cpu'):,}-token batches): the default" in text
    assert "tokenizer 2 processes x 2 threads" in text and "no word cache" in text and "padded reference" in text
    assert "packed" in text and result["machine"]["commit"] and "of zero per document" in text
    # the targets: on CPU only the device-independent ones are judged (and met); the card's say so
    judged = {v["target"]: v["met"] for v in result["targets"] if v["met"] is not None}
    assert judged == {"no padded tokens on the packed path": True,
                      "fp32 against the reference's fp32: identical id sets, max |dw| <= 1e-05, equal non-finite "
                      "counts": True}
    assert "## Against the targets" in text and "a card's target: this run is on CPU" in text


def test_gpu_encode_leaves_out_the_no_cache_row_where_the_cache_is_off(shared_data, tmp_path, load_script):
    """The Korean-vocabulary model (2.2 ids per chunk) keeps no word cache: its no-cache row would rerun the default."""
    module = load_script("gpu_encode")
    out = tmp_path / "r.json"
    module.main(["--out", str(out), "--data", str(shared_data), "--limit", "16", "--subset", "8", "--skip-splade-tiny",
                 "--targets", "--skip", "reference", "packed", "instrumentation", "packed_fp32", "budgets",
                 "exactness", "ndjson"])
    (row,) = json.loads(out.read_text())["models"]
    assert row["ids_per_chunk"] < 4 and "off by default" in row["packed_nocache"]["skipped"]
    # --targets left out the sections no target is read from (it keeps the CUDA-graph candidate) and the old
    # tokenizer layout's row
    assert set(row["section_s"]) == {"setup", "word_cache", "packed_graphs"}


def test_host_ops_name_the_costliest_operators_and_the_toolkit_lines_that_called_them(splade_tiny_dir, load_script,
                                                                                      shared_data):
    """What the card's profile reads to say where a batch's launch goes (run on CPU here: the same profiler)."""
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder

    gpu = load_script("gpu_encode")
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu", precision="fp32", batching="packed")
    with open(shared_data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line, _ in zip(fh, range(24))]
    rows = gpu.host_ops(enc, texts)
    assert rows and all(".py(" not in r["name"] for r in rows)  # operators, not Python frames
    assert rows == sorted(rows, key=lambda r: -r["self_ms_per_batch"]) and all(r["per_batch"] > 0 for r in rows)
    head = [r for r in rows if r["name"] == "aten::addmm" and any("head_max" in w for w in r["where"])]
    assert head and head[0]["where"][0].startswith("encoding/")  # innermost toolkit frame first


def test_collector_pauses_counts_the_collections_inside_the_block_only(load_script):
    import gc

    module = load_script("gpu_encode")
    gc.collect()
    with module.collector_pauses() as pauses:
        gc.collect(0)
        gc.collect(2)
    gc.collect()  # after the block: not counted
    assert pauses["collections"] == [1, 0, 1] and pauses["total_ms"] >= pauses["max_ms"] > 0
    assert all(cb.__name__ != "callback" for cb in gc.callbacks)


def test_exactness_reports_how_close_to_zero_the_disagreements_are(load_script):
    import numpy as np

    from opensearch_lsr.encoding.sparse_vector import SparseVector

    module = load_script("gpu_encode")

    def vec(ids, weights):
        return SparseVector(np.array(ids, dtype=np.int64), np.array(weights, dtype=np.float32))

    a = [vec([1, 2, 3], [0.5, 1.0, 2e-6]), vec([4], [1.0])]
    b = [vec([1, 2, 7], [0.5, 1.25, 3e-6]), vec([4], [0.75])]
    got = module.exactness(a, b)
    assert got["identical_id_sets"] == 1 and got["max_abs_dw"] == 0.25  # shared ids only
    assert np.isclose(got["max_unshared_weight"], 3e-6) and got["jaccard_mean"] == (0.5 + 1.0) / 2


def test_dev_mrr_ranks_by_dot_product_and_scores_the_first_relevant_hit(load_script):
    import numpy as np

    from opensearch_lsr.encoding.sparse_vector import SparseVector

    module = load_script("gpu_encode")

    def vec(ids, weights):
        return SparseVector(np.array(ids, dtype=np.int64), np.array(weights, dtype=np.float32))

    documents = [vec([1], [1.0]), vec([1, 2], [0.5, 1.0]), vec([3], [2.0])]
    queries = [vec([1], [1.0]),  # d0 (1.0) before d1 (0.5): its relevant d1 is second
               vec([2, 3], [1.0, 1.0]),  # d2 (2.0) first: relevant
               vec([4], [1.0])]  # no document shares an id: the stable order puts d0 first, its relevant d2 third
    qrels = {"a": {"d1"}, "b": {"d2"}, "c": {"d2"}}
    got = module.dev_mrr(queries, documents, ["a", "b", "c"], ["d0", "d1", "d2"], qrels, vocab=5)
    assert got == round((1 / 2 + 1 + 1 / 3) / 3, 4)


def test_targets_are_judged_from_a_card_run_at_their_thresholds(load_script):
    """A CUDA result built by hand: each target met just at its threshold, missed just past it, and a left-out
    section or an fp32 default says so instead of a verdict; with an fp16 default, bf16's distance keeps its own
    row."""
    targets = load_script("gpu_targets")

    def bert(busy: float, pct: float, share: float, jaccard: float, precision: str = "bf16") -> dict:
        return {"model": "bert-base-random (ko vocab, 12 x 768)", "gpu_busy_share": busy, "host_syncs_per_batch": 1.0,
                "packed": {"precision": precision, "pct_of_peak": pct, "docs_per_s": 16000.0, "padded_share": 0.0},
                "reference": {"docs_per_s": 2000.0}, "speedup_packed_over_reference": 8.0,
                "token_budgets": {"32768": {"peak_gpu_gb": 2.3}},
                "ndjson_end_to_end": {"packed": {"docs_per_s": 11200.0, "share_of_encode_only": share}},
                f"{precision}_vs_fp32_packed": {"jaccard_mean": jaccard, "max_abs_dw": 0.02}}

    def judged(result: dict) -> dict:
        return {(v.target.split(":")[0][:24], v.model[:6]): v.met for v in targets.verdicts(result)}

    tiny = {"model": "splade-tiny (2 x 128, 30,522 vocab)", "packed": {"precision": "bf16", "docs_per_s": 15000.0,
                                                                       "padded_share": 0.0},
            "packed_fp32": {"docs_per_s": 15001.0}}
    at = judged({"device": "cuda", "models": [bert(0.90, 40.0, 0.70, 0.99), tiny]})
    assert at[("half-precision encode >=", "bert-b")] and at[("GPU busy >= 90 % of the ", "bert-b")]
    assert at[("`lsr-os index --backend ", "bert-b")] and at[("bf16 against fp32", "bert-b")]
    assert at[("the default half precisi", "bert-b")]
    assert at[("SPLADE-tiny >= 15k docs/", "splade")] and at[("SPLADE-tiny half precisi", "splade")] is False
    assert at[("fp32 against the referen", "bert-b")] is None  # exactness section left out: not judged
    past = judged({"device": "cuda", "models": [bert(0.899, 39.99, 0.699, 0.9899)]})
    assert not any(past[(k, "bert-b")] for k in ("half-precision encode >=", "GPU busy >= 90 % of the ",
                                                 "`lsr-os index --backend ", "bf16 against fp32",
                                                 "the default half precisi"))
    fp16_card = bert(0.95, 45.0, 0.8, 0.995, "fp16")  # the default on CUDA: bf16's distance is judged on its own row
    fp16_card["bf16_vs_fp32_packed"] = {"jaccard_mean": 0.984, "max_abs_dw": 0.017}
    fp16_card["packed_bf16"] = {"pct_of_peak": 42.1, "docs_per_s": 15000.0}
    found = {v.target.split(":")[0]: v for v in targets.verdicts({"device": "cuda", "models": [fp16_card]})}
    assert found["the default half precision against fp32"].met and "fp16: Jaccard 0.9950" in found[
        "the default half precision against fp32"].measured
    assert found["bf16 against fp32"].met is False and "bf16: Jaccard 0.9840" in found["bf16 against fp32"].measured
    fp16_card["exact_packed_fp32_vs_reference_fp32"] = {"docs": 8192, "identical_id_sets": 8180, "max_abs_dw": 5.7e-6,
                                                        "nonfinite_reference": 0, "nonfinite_packed": 0}
    fp16_card["reference_fp32_vs_itself_at_a_quarter_batch"] = {"docs": 8192, "identical_id_sets": 8185}
    fp32 = [v for v in targets.verdicts({"device": "cuda", "models": [fp16_card]}) if v.target.startswith("fp32")]
    assert fp32[0].met is False and "8,180 / 8,192" in fp32[0].measured and "itself" in fp32[0].measured
    peak = found["half-precision encode >= 40 % of the measured peak"]
    assert peak.met and peak.measured.startswith("fp16 45.0 %") and "bf16 42.1 %" in peak.measured
    fp32_card = bert(0.95, 45.0, 0.8, 1.0)
    fp32_card["packed"]["precision"] = "fp32"
    (peak,) = [v for v in targets.verdicts({"device": "cuda", "models": [fp32_card]}) if "peak" in v.target
               and "40" in v.target]
    assert peak.met is None and "not bf16 / fp16" in peak.measured
