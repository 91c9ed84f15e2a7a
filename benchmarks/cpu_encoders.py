"""CPU document encoders at equal output: ours (torch, ONNX Runtime) vs sentence-transformers' backends.

Every variant encodes the same passages with the same batch size and thread count, each in its own
worker process (so thread pools and allocators do not leak between variants); the order of the variants
rotates between thread counts. Reported per model x threads x variant: documents per second (wall, after a
warm-up batch), the ratio to ``ours-torch`` (``SparseDocumentEncoder``, what ``lsr-os index`` runs by
default) measured in the same run, and, against ``ours-torch``'s vectors: max |weight difference| over the
non-special dimensions (ours zeroes the special-token dimensions as the exported OpenSearch model does;
sentence-transformers does not), the mean Jaccard overlap of the non-zero key sets, and dev MRR@10 with
every variant's documents and ``ours-torch`` queries (passages: the judged passages of the first dev
queries, filled up with corpus passages in file order; queries: the dev queries judged in them).

Variants (``--variants``; the defaults are all of them):

* ``ours-torch``: :class:`~opensearch_lsr.encoding.encoder.SparseDocumentEncoder` (baseline, fp32);
  ``ours-torch-bf16``: the same with bf16 autocast (``--precision bf16``; fast only where the CPU has
  AVX512-BF16/AMX, and not equal output).
* ``ours-onnx`` / ``ours-onnx-int8``: :class:`~opensearch_lsr.encoding.onnx_backend.OnnxSparseDocumentEncoder`
  (body in ONNX Runtime, fused; int8 dynamic quantization of the body; SPLADE head in torch);
  ``ours-onnx-bf16`` / ``ours-onnx-int8-bf16``: the same with the torch head under bf16 autocast.
* ``ours-openvino``: the same class with the plain ONNX body compiled by OpenVINO at f32 (equal output);
  ``ours-openvino-bf16``: the same export compiled at bf16 and the head under bf16 autocast
  (``--encoder-runtime openvino --precision bf16``; not equal output, like ``st-openvino`` on a bf16 CPU).
* ``st-torch``: sentence-transformers (this venv's version) ``SparseEncoder.encode_document``.
* ``st-onnx``, ``st-onnx-O1`` .. ``st-onnx-O4``, ``st-onnx-qint8``, ``st-openvino``, ``st-openvino-qint8``:
  sentence-transformers' ONNX / OpenVINO backends (``export_optimized_onnx_model``,
  ``export_dynamic_quantized_onnx_model(..., "avx512_vnni")``, ``export_static_quantized_openvino_model``
  calibrated on 100 other msmarco-ko passages). They need ``optimum-onnx`` / ``optimum-intel``, which
  (Nov 2026) pin ``transformers<4.58`` while sentence-transformers 6.x needs ``transformers>=5``: they run
  in a side venv (``--st-python``, e.g. sentence-transformers 5.7 + transformers 4.57), set up with
  ``python -m venv runs/venv-st-backends`` + a ``.pth`` line pointing at this venv's site-packages (for
  torch) + ``pip install "sentence-transformers[onnx,openvino]>=5.1,<6" "transformers<4.58" "datasets<4.5"
  torch==2.13.0``.

GPU (``--device cuda``): ``ours-torch`` (fp32), ``ours-torch-bf16`` and ``st-torch`` / ``st-torch-bf16``
(the ONNX/OpenVINO variants are CPU paths and are skipped); the table adds achieved TFLOP/s from a
per-token FLOP count of the body and MLM head, to set against the card's peak (``--peak-tflops``).

Example (the figures in ``benchmarks/results/scale/cpu_encoders.md``)::

    flock /tmp/lsr-heavy.lock nice -n 5 python benchmarks/cpu_encoders.py run --model splade-tiny \\
        --texts 1000 --threads 1 2 --out runs/cpu_encoders/tiny.json
    python benchmarks/cpu_encoders.py markdown runs/cpu_encoders/*.json > benchmarks/results/scale/cpu_encoders.md
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from harness import ROOT, corpus_texts, load_dataset, run_info, set_threads, time_call, write_json

DATA = Path("/work/shared/data/msmarco-ko")
OURS = ("ours-torch", "ours-onnx", "ours-onnx-int8", "ours-openvino")
ST_MAIN = ("st-torch",)
ST_SIDE = ("st-onnx", "st-onnx-O1", "st-onnx-O2", "st-onnx-O3", "st-onnx-O4", "st-onnx-qint8",
           "st-openvino", "st-openvino-qint8")
GPU_VARIANTS = ("ours-torch", "ours-torch-bf16", "st-torch", "st-torch-bf16")
ST_FILES = {"st-onnx": "onnx/model.onnx", "st-onnx-O1": "onnx/model_O1.onnx", "st-onnx-O2": "onnx/model_O2.onnx",
            "st-onnx-O3": "onnx/model_O3.onnx", "st-onnx-O4": "onnx/model_O4.onnx",
            "st-onnx-qint8": "onnx/model_qint8_avx512_vnni.onnx", "st-openvino": "openvino/openvino_model.xml",
            "st-openvino-qint8": "openvino/openvino_model_qint8_quantized.xml"}
HF_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "vocab.txt", "sentencepiece.bpe.model")


# ---------------------------------------------------------------------------------------------- data
def select_passages(n: int, judged_share: float = 0.5) -> tuple[list[str], list[str], list[str]]:
    """``n`` passages (ids, texts): the judged passages of the first dev queries (up to
    ``judged_share * n``), then corpus passages in file order; plus 300 calibration passages not among them."""
    ds = load_dataset(DATA, "dev")
    judged: list[str] = []
    for rels in ds.qrels.values():  # qrels/dev.tsv order
        for did, rel in rels.items():
            if rel > 0 and did not in judged and len(judged) < int(n * judged_share):
                judged.append(did)
    order, rows = corpus_texts(ds)
    rows = dict(zip(order, rows))
    chosen = list(judged)
    taken = set(chosen)
    for did in order:
        if len(chosen) >= n:
            break
        if did not in taken:
            chosen.append(did)
            taken.add(did)
    calib = [rows[d] for d in reversed(order) if d not in taken][:300]
    return chosen, [rows[d] for d in chosen], calib


# ---------------------------------------------------------------------------------------------- workers
def _save_vectors(path: Path, ids_list, weights_list) -> None:
    np.savez(path, ids=np.concatenate(ids_list).astype(np.int64), weights=np.concatenate(weights_list).astype(np.float32),
             lens=np.array([len(x) for x in ids_list], dtype=np.int64))


def _load_vectors(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    z = np.load(path)
    cuts = np.cumsum(z["lens"])[:-1]
    return list(zip(np.split(z["ids"], cuts), np.split(z["weights"], cuts)))


def _sparse_rows(emb) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows of a sentence-transformers sparse (COO) or dense ``[n, V]`` tensor as (ids, weights)."""
    emb = emb.coalesce() if emb.is_sparse else emb.to_sparse().coalesce()
    idx, val = emb.indices().numpy(), emb.values().float().numpy()
    n = emb.shape[0]
    order = np.lexsort((idx[1], idx[0]))
    rows, cols, vals = idx[0][order], idx[1][order], val[order]
    bounds = np.searchsorted(rows, np.arange(n + 1))
    keep = vals > 0
    ids_list, w_list = [], []
    for r in range(n):
        s = slice(bounds[r], bounds[r + 1])
        k = keep[s]
        ids_list.append(cols[s][k])
        w_list.append(vals[s][k])
    return ids_list, w_list


def _st_model(variant: str, model_dir: str, threads: int, device: str):
    from sentence_transformers import SparseEncoder

    if variant.startswith("st-torch"):
        kwargs = {"torch_dtype": "bfloat16"} if variant.endswith("bf16") else {}
        if (Path(model_dir) / "modules.json").exists():
            return SparseEncoder(model_dir, device=device, model_kwargs=kwargs)
        sys.path.insert(0, str(ROOT))
        from opensearch_lsr.transfer.surgery import load_sparse_encoder

        return load_sparse_encoder(model_dir, device=device)
    if variant.startswith("st-onnx"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return SparseEncoder(model_dir, backend="onnx", device="cpu",
                             model_kwargs={"file_name": ST_FILES[variant], "session_options": options,
                                           "provider": "CPUExecutionProvider"})
    return SparseEncoder(model_dir, backend="openvino", device="cpu",
                         model_kwargs={"file_name": ST_FILES[variant],
                                       "ov_config": {"INFERENCE_NUM_THREADS": str(threads)}})


def worker(args) -> None:
    """Encode ``--texts-file`` with one variant; write ``<out>.npz`` (vectors) and ``<out>.json`` (timing)."""
    import torch

    set_threads(args.threads)
    texts = json.loads(Path(args.texts_file).read_text(encoding="utf-8"))
    info: dict = {"variant": args.variant, "threads": args.threads, "docs": len(texts), "python": sys.executable}
    t0 = time.perf_counter()
    if args.variant.startswith("ours"):
        sys.path.insert(0, str(ROOT))
        from opensearch_lsr.encoding.onnx_backend import open_document_encoder

        runtime = {"ours-onnx": "onnx", "ours-onnx-int8": "onnx-int8", "ours-openvino": "openvino"}.get(args.variant.removesuffix("-bf16"), "torch")
        kwargs = {"device": args.device, "batch_size": args.batch_size, "num_threads": args.threads,
                  "precision": "bf16" if args.variant.endswith("bf16") else "fp32"}
        if runtime != "torch" and args.onnx_cache:
            kwargs["cache_dir"] = args.onnx_cache
        enc = open_document_encoder(args.model, runtime=runtime, **kwargs)
        info["special_ids"] = [int(i) for i in enc.special_ids]
        info["vocab"] = int(enc.vocab_size)
        info["tokens"] = int(sum(len(x) for x in enc.tokenize(texts)))
        info["flops_per_token"] = _flops_per_token(enc.model.config)

        def encode(batch):
            vecs = enc.encode(batch)
            return [v.ids for v in vecs], [v.weights for v in vecs]
    else:
        import sentence_transformers

        model = _st_model(args.variant, args.model, args.threads, args.device)
        model.max_seq_length = 512
        info["sentence_transformers"] = sentence_transformers.__version__

        def encode(batch):
            emb = model.encode_document(batch, batch_size=args.batch_size, convert_to_tensor=True,
                                        show_progress_bar=False)
            return _sparse_rows(emb.cpu())
    info["load_s"] = time.perf_counter() - t0
    encode(texts[:args.batch_size])  # warm-up (ONNX Runtime / OpenVINO compile on first shapes)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    def one_pass():
        out = encode(texts)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    # the median pass: a short run on a shared VM moves +-10 % from run to run
    timed = time_call(one_pass, repeats=args.repeats)
    ids_list, w_list = timed.result
    info["wall_s"], info["cpu_s"] = timed.median, float(np.median(timed.cpu_runs))
    info["wall_each_s"] = [round(x, 3) for x in timed.runs]
    info["docs_per_s"] = len(texts) / info["wall_s"]
    _save_vectors(Path(args.out + ".npz"), ids_list, w_list)
    write_json(args.out + ".json", info)


def _flops_per_token(config) -> float:
    """Multiply-adds x 2 per token of a BERT-style body + MLM head (attention scores excluded)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    inter = getattr(config, "intermediate_size", 4 * h)
    return 2.0 * (layers * (4 * h * h + 2 * h * inter) + h * h + h * config.vocab_size)


def prepare_st(args) -> None:
    """(side venv) Copy the model's HF files to ``--st-dir`` and export the ST ONNX / OpenVINO variants there."""
    import logging

    from sentence_transformers import (SparseEncoder, export_dynamic_quantized_onnx_model,
                                       export_optimized_onnx_model, export_static_quantized_openvino_model)

    logging.basicConfig(level=logging.WARNING)
    src, dst = Path(args.model), Path(args.st_dir)
    dst.mkdir(parents=True, exist_ok=True)
    for name in HF_FILES:
        if (src / name).exists() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)
    pooling = _pooling(src)
    status: dict[str, str] = {}
    wanted = set(args.variants)

    if pooling != "relu":
        raise SystemExit(f"{src}: SpladePooling activation {pooling!r}; the side-venv variants assume relu")

    def load(backend):
        # a plain HF masked-LM dir is wrapped as Transformer(fill-mask) + SpladePooling(max, relu)
        model = SparseEncoder(str(dst), backend=backend, device="cpu")
        model.max_seq_length = 512
        return model

    if wanted & {v for v in ST_SIDE if "onnx" in v}:
        model = load("onnx")
        if not (dst / ST_FILES["st-onnx"]).exists():
            model.save_pretrained(str(dst))  # the exported model.onnx lands in onnx/
        status["st-onnx"] = "ok"
        for level in ("O1", "O2", "O3", "O4"):
            if f"st-onnx-{level}" in wanted and not (dst / ST_FILES[f"st-onnx-{level}"]).exists():
                try:
                    export_optimized_onnx_model(model, level, str(dst))
                    status[f"st-onnx-{level}"] = "ok"
                except Exception as err:  # noqa: BLE001 - recorded in the results (O4 is fp16, GPU only)
                    status[f"st-onnx-{level}"] = f"export failed: {type(err).__name__}: {str(err)[:200]}"
        if "st-onnx-qint8" in wanted and not (dst / ST_FILES["st-onnx-qint8"]).exists():
            export_dynamic_quantized_onnx_model(model, "avx512_vnni", str(dst))
    if wanted & {"st-openvino", "st-openvino-qint8"}:
        model = load("openvino")
        if not (dst / ST_FILES["st-openvino"]).exists():
            model.save_pretrained(str(dst))  # openvino/openvino_model.xml
        if "st-openvino-qint8" in wanted and not (dst / ST_FILES["st-openvino-qint8"]).exists():
            calib = dst / "calibration"
            calib.mkdir(exist_ok=True)
            with open(calib / "train.jsonl", "w", encoding="utf-8") as fh:
                for text in json.loads(Path(args.calibration).read_text(encoding="utf-8")):
                    fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            from optimum.intel import OVQuantizationConfig

            # 100 calibration passages (ST's default is 300 sst2 sentences from the hub: offline here)
            export_static_quantized_openvino_model(model, OVQuantizationConfig(num_samples=100), str(dst),
                                                   dataset_name=str(calib),
                                                   dataset_config_name="default", dataset_split="train",
                                                   column_name="text")
    for v in ST_SIDE:
        if v in wanted and v not in status:
            status[v] = "ok" if (dst / ST_FILES[v]).exists() else "not exported"
    (dst / "st_variants.json").write_text(json.dumps(status, indent=1))


def _pooling(model_dir: Path) -> str:
    """The SpladePooling activation saved in ``model_dir`` (``encoder._pooling_config``'s reading, repeated here:
    ``prepare-st`` runs in the side venv, where ``opensearch_lsr`` is not importable)."""
    modules = model_dir / "modules.json"
    if modules.exists():
        for entry in json.loads(modules.read_text()):
            if entry.get("type", "").endswith("SpladePooling"):
                cfg = model_dir / entry["path"] / "config.json"
                if cfg.exists():
                    return json.loads(cfg.read_text()).get("activation_function", "relu")
    return "relu"


# ---------------------------------------------------------------------------------------------- orchestration
def _machine(info: dict) -> dict:
    """The run's machine (``harness.machine``) with the keys the tables of older result files use too."""
    m = info["machine"]
    return {**m, "nproc": m["cores"], "ram": f"{m['ram_gib']} GiB", "cpu_flags": " ".join(m["cpu_flags"]),
            "loadavg_start": m["loadavg"], "date": info["date"], "commit": info["commit"]}


def _versions(python: str) -> dict:
    code = ("import json,importlib.metadata as m;out={}\n"
            "for p in ('torch','transformers','sentence-transformers','onnxruntime','optimum-onnx','optimum-intel',"
            "'openvino'):\n try: out[p]=m.version(p)\n except Exception: pass\nprint(json.dumps(out))")
    try:
        return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}


def _run_worker(python: str, variant: str, model: str, texts_file: Path, threads: int, out: Path, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT) if variant.startswith("ours") else "")
    cmd = [python, __file__, "worker", "--variant", variant, "--model", model, "--texts-file", str(texts_file),
           "--threads", str(threads), "--batch-size", str(args.batch_size), "--repeats", str(args.repeats),
           "--device", args.device, "--out", str(out),
           "--onnx-cache", str(out.parent / "onnx-lsr")]
    print(f"[{time.strftime('%H:%M:%S')}] {variant} x{threads} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        print(f"  failed: {' | '.join(tail)}", file=sys.stderr, flush=True)
        return {"variant": variant, "threads": threads, "error": " | ".join(tail)[-400:]}
    info = json.loads(Path(str(out) + ".json").read_text())
    print(f"  {info['docs_per_s']:.2f} docs/s", file=sys.stderr, flush=True)
    return info


def _compare(ref, other, special: set[int], vocab: int) -> tuple[float, float]:
    """Max |weight difference| over non-special dims and mean Jaccard of non-special key sets."""
    keep = np.ones(vocab, dtype=bool)
    keep[sorted(special)] = False
    max_abs, jacc = 0.0, []
    a, b = np.zeros(vocab, np.float32), np.zeros(vocab, np.float32)
    for (ri, rw), (oi, ow) in zip(ref, other):
        a[:] = 0.0
        b[:] = 0.0
        a[ri], b[oi] = rw, ow
        a[~keep], b[~keep] = 0.0, 0.0
        max_abs = max(max_abs, float(np.abs(a - b).max()))
        union = int(((a > 0) | (b > 0)).sum())
        jacc.append(int(((a > 0) & (b > 0)).sum()) / union if union else 1.0)
    return max_abs, float(np.mean(jacc))


def make_random_model(out: Path, layers: int = 12, hidden: int = 768, active: float = 0.01) -> Path:
    """A randomly initialised BERT-base-sized SparseEncoder dir (30,522-token uncased WordPiece vocab of
    SPLADE-tiny), its decoder bias shifted so that about ``active`` of the vocabulary is non-zero per
    document (real SPLADE documents activate ~100-300 terms; the default init would activate half)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    sys.path.insert(0, str(ROOT))
    from opensearch_lsr.resources import splade_tiny_path
    from opensearch_lsr.transfer.surgery import load_target_tokenizer, save_sparse_encoder

    if (out / "modules.json").exists():
        return out
    tok = load_target_tokenizer(str(splade_tiny_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=hidden // 64, intermediate_size=4 * hidden, tie_word_embeddings=True)
    model = BertForMaskedLM(config).eval()
    _, texts, _ = select_passages(16)
    batch = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**batch).logits.masked_fill(~batch["attention_mask"].bool()[..., None], -1e4).amax(1)
        shift = float(torch.quantile(logits.flatten()[:1_000_000], 1.0 - active))
        model.cls.predictions.bias.sub_(shift)
    return save_sparse_encoder(model, tok, out)


def _mrr(doc_ids: list[str], docs, queries_ours, qids, qrels, vocab: int, special: set[int]) -> float:
    import scipy.sparse as sp

    sys.path.insert(0, str(ROOT))
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from opensearch_lsr.evaluation.retrieval import top_k_run

    def csr(vectors):
        data, ind, ptr = [], [], [0]
        for ids, w in vectors:
            keep = np.array([int(i) not in special for i in ids], dtype=bool) if len(ids) else np.zeros(0, bool)
            data.append(w[keep])
            ind.append(ids[keep])
            ptr.append(ptr[-1] + int(keep.sum()))
        return sp.csr_matrix((np.concatenate(data), np.concatenate(ind), np.array(ptr)), shape=(len(vectors), vocab))

    run = top_k_run(csr(queries_ours), csr(docs), qids, doc_ids, k=100)
    return float(evaluate_run(qrels, run)["mrr@10"])


def run(args) -> None:
    sys.path.insert(0, str(ROOT))
    from opensearch_lsr.transfer.surgery import resolve_model_path

    if args.model == "bert-base-random":
        model = str(make_random_model(Path(args.work) / "models" / "bert-base-random"))
    else:
        model = resolve_model_path(args.model)
    name = args.name or Path(model).name
    work = Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    doc_ids, texts, calib = select_passages(args.texts)
    texts_file = work / "texts.json"
    write_json(texts_file, texts)
    write_json(work / "calibration.json", calib)
    on_gpu = args.device.startswith("cuda")
    variants = list(args.variants or (GPU_VARIANTS if on_gpu else OURS + ST_MAIN + ST_SIDE))
    side = [v for v in variants if v in ST_SIDE]
    info = run_info()
    result: dict = {"command": info["command"], "model": args.model,
                    "model_path": model, "name": name, "docs": len(texts), "batch_size": args.batch_size,
                    "repeats": args.repeats,
                    "device": args.device, "machine": _machine(info), "versions": _versions(sys.executable),
                    "rows": [], "st_export": {}, "work": str(work)}
    st_dir = work / "st"
    if side:
        if not Path(args.st_python).exists():
            result["st_export"] = {v: f"skipped: no side venv at {args.st_python}" for v in side}
            variants = [v for v in variants if v not in side]
        else:
            result["versions_side"] = _versions(args.st_python)
            t = time.perf_counter()
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="")
            proc = subprocess.run([args.st_python, __file__, "prepare-st", "--model", model, "--st-dir", str(st_dir),
                                   "--calibration", str(work / "calibration.json"), "--variants", *side],
                                  env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
            status_file = st_dir / "st_variants.json"
            result["st_export"] = json.loads(status_file.read_text()) if status_file.exists() else {
                v: "prepare failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:300] for v in side}
            result["st_export_s"] = time.perf_counter() - t
            variants = [v for v in variants if v not in side or result["st_export"].get(v) == "ok"]
    # ours: build the ONNX exports once, untimed, in the work dir (lsr-os index caches next to the model)
    for v in variants:
        if v.startswith(("ours-onnx", "ours-openvino")):
            from opensearch_lsr.encoding.onnx_backend import OnnxSparseDocumentEncoder

            OnnxSparseDocumentEncoder(model, runtime=v[5:].removesuffix("-bf16"), num_threads=1,  # type: ignore[arg-type]
                                      cache_dir=work / "onnx-lsr")
    for k, threads in enumerate(args.threads):
        order = variants[k % len(variants):] + variants[:k % len(variants)]
        if "ours-torch" in order:  # the baseline first, so a failed run still has its reference
            order.remove("ours-torch")
            order.insert(0, "ours-torch")
        for v in order:
            python = args.st_python if v in ST_SIDE else sys.executable
            mdir = str(st_dir) if v in ST_SIDE else model
            info = _run_worker(python, v, mdir, texts_file, threads, work / f"{v}_t{threads}", args)
            info["loadavg_after"] = os.getloadavg()[0]
            result["rows"].append(info)
            write_json(args.out, result)
    _score(result, work, doc_ids)
    result["machine"]["loadavg_end"] = os.getloadavg()
    write_json(args.out, result)


def _row_file(result: dict, row: dict) -> str:
    return str(Path(result["work"]) / f"{row['variant']}_t{row['threads']}")


def _score(result: dict, work: Path, doc_ids: list[str]) -> None:
    """Docs/s ratios, output differences and MRR@10 against ``ours-torch`` at the same thread count."""
    sys.path.insert(0, str(ROOT))
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder

    base = {r["threads"]: r for r in result["rows"] if r["variant"] == "ours-torch" and "error" not in r}
    if not base:
        return
    ref_info = next(iter(base.values()))
    special = set(ref_info["special_ids"])
    ref = _load_vectors(work / f"ours-torch_t{ref_info['threads']}.npz")
    ds = load_dataset(DATA, "dev")
    kept = set(doc_ids)
    qids = [q for q in ds.queries if any(d in kept and r > 0 for d, r in ds.qrels.get(q, {}).items())]
    qrels = {q: ds.qrels[q] for q in qids}
    enc = SparseDocumentEncoder(result["model_path"], device="cpu", num_threads=1)
    queries = [(v.ids, v.weights) for v in enc.encode([ds.queries[q] for q in qids])]
    result["mrr_queries"], result["mrr_passages"] = len(qids), len(doc_ids)
    for r in result["rows"]:
        if "error" in r:
            continue
        if r["threads"] in base:
            r["ratio_vs_ours"] = r["docs_per_s"] / base[r["threads"]]["docs_per_s"]
        vecs = _load_vectors(work / f"{r['variant']}_t{r['threads']}.npz")
        r["max_abs_diff"], r["jaccard"] = _compare(ref, vecs, special, ref_info["vocab"])
        r["active_per_doc"] = float(np.mean([sum(int(i) not in special for i in ids) for ids, _ in vecs]))
        r["mrr10"] = _mrr(doc_ids, vecs, queries, qids, qrels, ref_info["vocab"], special)


# ---------------------------------------------------------------------------------------------- report
def base_tokens(res: dict) -> str:
    return next((f"{r['tokens']:,}" for r in res["rows"] if r["variant"] == "ours-torch" and "tokens" in r), "?")


def markdown(paths: list[str]) -> str:
    out = []
    for p in paths:
        res = json.loads(Path(p).read_text())
        m = res["machine"]
        out += [f"### {res['name']} ({res['docs']} passages, batch {res['batch_size']}, {res['device']})", "",
                f"`{res['command']}`", "",
                f"{m['date']}" + (f", commit `{m['commit']}`" if m.get("commit") else "") + f"; {m['nproc']} CPUs ({m['cpu']}; {m['cpu_flags'].strip() or 'no VNNI/AMX'}), "
                f"RAM {m['ram']}; load average {m['loadavg_start'][0]:.2f} at the start, "
                f"{m.get('loadavg_end', [float('nan')])[0]:.2f} at the end. Versions: {res['versions']}; "
                f"side venv: {res.get('versions_side', '-')}. MRR@10 over {res.get('mrr_passages')} passages and "
                f"{res.get('mrr_queries')} dev queries judged in them (queries: ours-torch). GFLOP/s: the body + MLM-head "
                f"FLOPs of ours-torch's tokens ({base_tokens(res)} tokens) per wall second, the same work for every row."
                + (f" docs/s and CPU s: the median of {res['repeats']} timed passes." if res.get("repeats", 1) > 1 else ""),
                "",
                "| variant | threads | docs/s | x ours-torch | CPU s | GFLOP/s | max \\|dw\\| | key Jaccard | active keys/doc | MRR@10 |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        base = next((r for r in res["rows"] if r["variant"] == "ours-torch" and "tokens" in r), None)
        work = base["tokens"] * base["flops_per_token"] / 1e9 if base else float("nan")  # GFLOP for all passages
        for r in res["rows"]:
            if "error" in r:
                out.append(f"| {r['variant']} | {r['threads']} | failed: {r['error'][:120]} | | | | | | | |")
                continue
            out.append(f"| {r['variant']} | {r['threads']} | {r['docs_per_s']:.2f} | {r.get('ratio_vs_ours', float('nan')):.2f} "
                       f"| {r['cpu_s']:.1f} | {work / r['wall_s']:.1f} | {r.get('max_abs_diff', float('nan')):.2e} | {r.get('jaccard', float('nan')):.4f} "
                       f"| {r.get('active_per_doc', float('nan')):.1f} | {r.get('mrr10', float('nan')):.4f} |")
        if res.get("note"):
            out += ["", f"Note: {res['note']}."]
        skipped = {v: s for v, s in res.get("st_export", {}).items() if s != "ok"}
        if skipped:
            out += ["", "Not measured: " + "; ".join(f"`{v}`: {s}" for v, s in skipped.items())]
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--name", default=None)
    r.add_argument("--texts", type=int, default=1000)
    r.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    r.add_argument("--batch-size", type=int, default=32)
    r.add_argument("--repeats", type=int, default=1, help="timed passes per variant; the median is reported")
    r.add_argument("--variants", nargs="+", default=None)
    r.add_argument("--device", default="cpu")
    r.add_argument("--st-python", default=str(ROOT / "runs/venv-st-backends/bin/python"))
    r.add_argument("--work", default=str(ROOT / "runs/cpu_encoders"))
    r.add_argument("--out", required=True)
    w = sub.add_parser("worker")
    for flag in ("--variant", "--model", "--texts-file", "--device", "--out"):
        w.add_argument(flag, required=True)
    w.add_argument("--threads", type=int, required=True)
    w.add_argument("--batch-size", type=int, default=32)
    w.add_argument("--repeats", type=int, default=1)
    w.add_argument("--onnx-cache", default=None, help="where ours-onnx* keep their export (default: next to the model)")
    p = sub.add_parser("prepare-st")
    p.add_argument("--model", required=True)
    p.add_argument("--st-dir", required=True)
    p.add_argument("--calibration", required=True)
    p.add_argument("--variants", nargs="+", default=list(ST_SIDE))
    sc = sub.add_parser("score", help="score a run JSON whose run was cut short (rows saved, no scores)")
    sc.add_argument("path")
    m = sub.add_parser("markdown")
    m.add_argument("paths", nargs="+")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args)
    elif args.cmd == "worker":
        worker(args)
    elif args.cmd == "score":
        res = json.loads(Path(args.path).read_text())
        res["rows"] = [r for r in res["rows"] if "error" in r or Path(_row_file(res, r) + ".npz").exists()]
        _score(res, Path(_row_file(res, res["rows"][0])).parent, select_passages(res["docs"])[0])
        res["note"] = "cut short by the 15-minute lock limit; scored afterwards with the score command"
        write_json(args.path, res)
    elif args.cmd == "prepare-st":
        prepare_st(args)
    else:
        print(markdown(args.paths))


if __name__ == "__main__":
    main()
