"""`lsr-os tune-hybrid`: the grid fuses exactly as neural-search (HybridFusion) does, picks the best on the
tuning queries only, and its choice becomes the pipeline `create-pipeline --from-tuning` writes."""
from __future__ import annotations

import json
import random

import pytest

from opensearch_lsr.evaluation.hybrid_tuning import (HybridGrid, HybridSetting, fuse_grid, tune_on_runs,
                                                     tuning_query_ids)
from opensearch_lsr.lexical.fusion import HybridFusion


def _runs(seed: int, queries: int = 30, docs: int = 60, depth: int = 40):
    rng = random.Random(seed)
    bm25, sparse = {}, {}
    for q in range(queries):
        for run, scale in ((bm25, 20.0), (sparse, 3.0)):
            ids = rng.sample([f"d{i}" for i in range(docs)], depth)
            scores = sorted((round(rng.random() * scale, 3) for _ in ids), reverse=True)  # some exact ties
            run[f"q{q}"] = list(zip(ids, scores))
    return bm25, sparse


def test_grid_ranks_like_hybrid_fusion():
    bm25, sparse = _runs(0)
    grid = HybridGrid(weight_step=0.25, rank_constants=[1, 7, 60], depths=[10, 40])
    fused = fuse_grid(bm25, sparse, grid, k=10)
    assert len(fused) == 2 * (5 + 3)
    for setting, top in fused.items():
        fusion = setting.fusion()
        for qid in bm25:
            subs = [bm25[qid][:setting.depth], sparse[qid][:setting.depth]]
            assert top[qid] == [d for d, _ in fusion.fuse(subs, size=10)], (setting, qid)


def test_z_score_and_l2_settings_rank_like_hybrid_fusion():
    bm25, sparse = _runs(2)
    grid = HybridGrid(weight_step=0.25, depths=[10, 40], techniques=["z_score", "l2", "rrf"], rank_constants=[60])
    fused = fuse_grid(bm25, sparse, grid, k=10)
    assert {s.technique for s in fused} == {"z_score", "l2", "rrf"} and len(fused) == 2 * (5 + 5 + 1)
    for setting, top in fused.items():
        for qid in bm25:
            subs = [bm25[qid][:setting.depth], sparse[qid][:setting.depth]]
            assert top[qid] == [d for d, _ in setting.fusion().fuse(subs, size=10)], (setting, qid)
    qrels = {q: {sparse[q][0][0]: 1} for q in bm25}
    tuned = tune_on_runs(bm25, sparse, qrels, grid)
    assert set(tuned.best_per_technique) == {"z_score", "l2", "rrf"}
    assert HybridSetting(**tuned.best_per_technique["z_score"]["setting"]).label().startswith("z-score ")


def test_best_setting_is_the_argmax_and_only_tuning_queries_count():
    bm25, sparse = _runs(1)
    # judge, per query, the top document of the sparse run: the sparse-heavy settings must win
    qrels = {q: {sparse[q][0][0]: 1} for q in bm25}
    tuned = tune_on_runs(bm25, sparse, qrels, HybridGrid(weight_step=0.1, rank_constants=[1, 60], depths=[10]))
    assert tuned.queries == 30 and tuned.sub_queries["sparse"]["mrr@10"] == pytest.approx(1.0)
    assert tuned.best["mrr@10"] == max(r["mrr@10"] for r in tuned.settings) == pytest.approx(1.0)
    assert tuned.best["setting"]["technique"] == "min_max" and tuned.best["setting"]["bm25_weight"] < 0.5
    assert HybridSetting(**tuned.best["setting"]).fusion().pipeline()["phase_results_processors"]
    # queries outside qrels are ignored even when runs carry them
    fewer = tune_on_runs(bm25, sparse, {q: qrels[q] for q in list(qrels)[:5]},
                         HybridGrid(weight_step=0.5, rank_constants=[60], depths=[10]))
    assert fewer.queries == 5


def test_grid_validation():
    with pytest.raises(ValueError, match="divide 1"):
        HybridGrid(weight_step=0.3).validate()
    with pytest.raises(ValueError, match="depths"):
        HybridGrid(depths=[5]).validate()
    with pytest.raises(ValueError, match="rank constants"):
        HybridGrid(rank_constants=[0]).validate()
    with pytest.raises(ValueError, match="techniques must be some of min_max, z_score, l2, rrf"):
        HybridGrid(techniques=["max"]).validate()


def test_tuning_queries_come_from_the_models_holdout(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "holdout_queries.json").write_text(json.dumps({"split": "train", "query_ids": ["q3", "q1"]}))
    ids, source = tuning_query_ids(str(model), "unused", "train")
    assert ids == ["q3", "q1"] and source.endswith("holdout_queries.json")
    listing = tmp_path / "ids.txt"
    listing.write_text("a\nb\n")
    assert tuning_query_ids(str(model), "unused", "train", query_ids_file=str(listing))[0] == ["a", "b"]


WORDS = ["seoul", "capital", "korea", "paris", "france", "river", "city", "cat", "dog", "book", "school", "road"]


def _beir(root):
    """40 train queries of two words; each judges the one passage that repeats them."""
    (root / "qrels").mkdir(parents=True)
    rng = random.Random(3)
    corpus, queries, qrels = [], [], []
    for i in range(40):
        a, b = rng.sample(WORDS, 2)
        corpus.append({"_id": f"d{i}", "text": f"{a} {b} {a} " + " ".join(rng.sample(WORDS, 3))})
        queries.append({"_id": f"q{i}", "text": f"{a} {b}"})
        qrels.append(f"q{i}\td{i}\t1\n")
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(qrels))
    return root


def test_cli_tune_hybrid_then_create_pipeline_from_it(tmp_path, tiny_source_dir):
    pytest.importorskip("mecab_ko")
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from opensearch_lsr.cli import cli
    root = _beir(tmp_path / "b")
    runner = CliRunner()
    out = tmp_path / "tuned"
    res = runner.invoke(cli, ["tune-hybrid", "--dataset", str(root), "--model", str(tiny_source_dir), "--queries", "12",
                              "--rank-constants", "1-5", "--weight-step", "0.25", "--depths", "10,20", "--out", str(out)])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout[res.stdout.index("{"):])
    assert printed["queries"] == 12 and "drawn with seed 42" in printed["query_source"]
    saved = json.loads((out / "hybrid_tuning.json").read_text())
    assert len(saved["settings"]) == 2 * (5 + 5)
    assert saved["best"]["mrr@10"] == max(r["mrr@10"] for r in saved["settings"])
    pipeline = json.loads((out / "search_pipeline.json").read_text())
    assert pipeline == HybridSetting(**saved["best"]["setting"]).fusion().pipeline()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensearch"))
    from double.fixtures import make_double

    double = make_double("3.3.0")
    try:
        res = runner.invoke(cli, ["create-pipeline", "hybrid", "tuned", "--from-tuning", str(out / "hybrid_tuning.json"),
                                  "--url", double.url])
        assert res.exit_code == 0, res.output
        body = json.loads(res.output)["body"]
        assert HybridFusion.from_pipeline(body) == HybridSetting(**saved["best"]["setting"]).fusion()
        assert json.loads(res.output)["pagination_depth"] == saved["best"]["setting"]["depth"]
        assert double.violations == []
    finally:
        double.stop()
