"""A Hugging Face text pipeline served by Triton vs the library it came from, and vs its bare model (issue 35).

Builds the MiniLM sentiment example (examples/minilm/sentiment.yaml: all-MiniLM-L6-v2 with a small trained head;
`python examples/minilm/prepare.py` makes its folder, this script does too when it is missing) with the onnx
variant alone (the FP32 model) and, unless --no-default, with the default variants (what `build` publishes
without --variants), serves each with the embedded tritonserver and prints side by side in one run:

- the served ensemble (text in, label out) vs transformers' ``pipeline("text-classification")`` on the same texts
  (examples/minilm/data: the 28 validation texts and the 30 training texts): labels identical (%), the largest
  relative error of the top score and the largest absolute error over all scores;
- served throughput of the ensemble (texts) vs the bare ``<name>__model`` sent the same texts tokenized by the
  same tokenizer.json (ids of each text's own length), same batch (1) and concurrency, measured by the sweep
  engine (perf_analyzer when installed, else the Python client): target ensemble >= 0.8x bare;
- where the ensemble's time goes per step (tokenizer, model, post-processing, hand-offs), from Triton's
  statistics of each step (builder/tuning/steps.py).

The host's CPU model and ISA flags are printed first: every figure depends on them.

Usage: python benchmarks/hf_pipeline.py [--levels 1,4] [--seconds-per-level 8] [--no-default] [--json out.json]
       (make bench-hf)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from builder.core.host import host_profile  # noqa: E402
from builder.pipeline import build  # noqa: E402
from builder.serving.client import TritonClient  # noqa: E402
from builder.serving.embedded import EmbeddedServer  # noqa: E402
from builder.tuning.steps import format_step_table  # noqa: E402
from builder.tuning.sweep import run_sweep  # noqa: E402
from builder.tuning.text_payload import write_texts_npz  # noqa: E402

EXAMPLE = ROOT / "examples" / "minilm"
NAME = "minilm_sentiment"
TARGET_RATIO = 0.8


def texts() -> list[str]:
    seen: list[str] = []
    for line in (EXAMPLE / "data" / "texts.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and line.strip() not in seen:
            seen.append(line.strip())
    for line in (EXAMPLE / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"].strip() if line.strip() else ""
        if text and text not in seen:
            seen.append(text)
    return seen


def sentiment_folder() -> Path:
    folder = EXAMPLE / "sentiment"
    if not (folder / "config.json").is_file():
        import importlib.util

        spec = importlib.util.spec_from_file_location("minilm_prepare", EXAMPLE / "prepare.py")
        prepare = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(prepare)
        prepare.make_sentiment(folder)
    return folder


def library_reference(folder: Path, sentences: list[str]) -> tuple[list[str], np.ndarray, list[str], str]:
    """transformers' pipeline on the texts: top labels, every label's score (in id2label order), the label order."""
    import transformers
    from transformers import pipeline

    classifier = pipeline("text-classification", model=str(folder), tokenizer=str(folder), top_k=None, device=-1)
    order = [classifier.model.config.id2label[i] for i in range(len(classifier.model.config.id2label))]
    answers = classifier(sentences, batch_size=8)
    scores = np.array([[{a["label"]: a["score"] for a in answer}[label] for label in order] for answer in answers],
                      dtype=np.float64)
    labels = [order[int(i)] for i in scores.argmax(axis=1)]
    return labels, scores, order, f"transformers {transformers.__version__}"


def served_answers(url: str, sentences: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    labels, top, scores = [], [], []
    with TritonClient(url, "grpc") as client:
        for start in range(0, len(sentences), 8):
            batch = np.array([[s.encode("utf-8")] for s in sentences[start:start + 8]], dtype=object)
            got = client.infer(NAME, {"text": batch})
            labels += [v.decode() if isinstance(v, bytes) else str(v) for v in got["label"].reshape(-1)]
            top += got["score"].reshape(-1).tolist()
            scores.append(got["scores"])
    return labels, np.array(top, dtype=np.float64), np.concatenate(scores).astype(np.float64)


def ids_payload(repo: Path, url: str, sentences: list[str], path: Path) -> Path:
    """The texts tokenized as the served tokenizer step does (its tokenizer.json, each text at its own length),
    as a reference.npz-style payload for the bare model: one case per text."""
    from tokenizers import Tokenizer

    from builder.tuning.payload import fetch_model

    tokenizer = Tokenizer.from_file(str(repo / f"{NAME}__preprocess" / "1" / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    inputs = [name for name, _, _ in fetch_model(url, "grpc", NAME + "__model").inputs]
    arrays = {}
    for index, text in enumerate(sentences):
        encoded = tokenizer.encode(text)
        values = {"input_ids": encoded.ids, "attention_mask": encoded.attention_mask,
                  "token_type_ids": encoded.type_ids}
        for name in inputs:
            arrays[f"input/{index:03d}/{name}"] = np.array([values[name]], dtype=np.int64)
    np.savez(path, **arrays)
    return path


def measure(repo: Path, label: str, sentences: list[str], reference, args, work: Path) -> dict:
    ref_labels, ref_scores, order, library = reference
    result: dict = {"variant": label}
    with EmbeddedServer(repo, ready_timeout=240) as server:
        url = f"127.0.0.1:{server.grpc_port}"
        labels, top, scores = served_answers(url, sentences)
        ref_top = ref_scores.max(axis=1)
        result.update({
            "texts": len(sentences), "library": library,
            "labels_identical_pct": round(100.0 * float(np.mean([a == b for a, b in zip(labels, ref_labels)])), 2),
            "top_score_max_rel_error": float(np.max(np.abs(top - ref_top) / np.maximum(np.abs(ref_top), 1e-12))),
            "scores_max_abs_error": float(np.max(np.abs(scores - ref_scores))),
        })
        texts_npz = write_texts_npz(work / f"{label}-texts.npz", "text", sentences)
        ids_npz = ids_payload(repo, url, sentences, work / f"{label}-ids.npz")
        common = {"levels": args.levels, "max_seconds_per_level": args.seconds_per_level, "engine": args.engine}
        say = print if args.verbose else None
        ensemble = run_sweep(NAME, url, "grpc", out_dir=work / f"{label}-sweep-ensemble", payload=texts_npz,
                             progress=say, **common)
        bare = run_sweep(NAME + "__model", url, "grpc", out_dir=work / f"{label}-sweep-bare", payload=ids_npz,
                         progress=say, **common)
    result["engine"], result["client"] = ensemble["engine"], ensemble["client"]
    result["levels"] = []
    for e, b in zip(ensemble["levels"], bare["levels"]):
        ratio = e["throughput_rps"] / b["throughput_rps"] if b["throughput_rps"] else None
        result["levels"].append({"concurrency": e["concurrency"], "ensemble_rps": e["throughput_rps"],
                                 "bare_rps": b["throughput_rps"], "ratio": round(ratio, 3) if ratio else None,
                                 "ensemble_p50_ms": e["p50_ms"], "bare_p50_ms": b["p50_ms"],
                                 "ensemble_p99_ms": e["p99_ms"], "bare_p99_ms": b["p99_ms"],
                                 "failures": e["failures"] + b["failures"],
                                 "stable": bool(e["stable"] and b["stable"]), "steps": e.get("steps")})
    return result


def published_variant(repo: Path) -> str:
    import yaml

    versions = sorted((p for p in (repo / f"{NAME}__model").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    meta = yaml.safe_load((versions[-1] / "metadata.yaml").read_text())
    artifact = meta.get("artifact") or {}
    return f"{artifact.get('variant', '?')}, {artifact.get('precision', '?')}"


def table(results: list[dict], host_line: str) -> str:
    rows = [["", *[f"{r['variant']} ({r['published']})" for r in results]]]
    rows.append(["build (s)", *[f"{r['build_s']:.0f}" for r in results]])
    rows.append([f"labels = {results[0]['library']} pipeline", *[f"{r['labels_identical_pct']:.1f} % of {r['texts']}"
                                                                 for r in results]])
    rows.append(["top score, max rel error", *[f"{r['top_score_max_rel_error']:.1e}" for r in results]])
    rows.append(["scores, max abs error", *[f"{r['scores_max_abs_error']:.1e}" for r in results]])
    for index, level in enumerate(results[0]["levels"]):
        c = level["concurrency"]
        rows.append([f"ensemble (text) req/s, c={c}", *[f"{r['levels'][index]['ensemble_rps']:.1f}" for r in results]])
        rows.append([f"bare __model (ids) req/s, c={c}", *[f"{r['levels'][index]['bare_rps']:.1f}" for r in results]])
        rows.append([f"ensemble / bare, c={c} (target >= {TARGET_RATIO}x)",
                     *[_ratio(r["levels"][index]) for r in results]])
        rows.append([f"p50 ms ensemble / bare, c={c}",
                     *[f"{r['levels'][index]['ensemble_p50_ms']:.2f} / {r['levels'][index]['bare_p50_ms']:.2f}"
                       for r in results]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    out = [host_line, f"engine: {results[0]['client']}; batch 1; {results[0]['texts']} texts", "", *lines]
    for r in results:
        split = format_step_table([(lv["concurrency"], lv["steps"]) for lv in r["levels"] if lv.get("steps")])
        if split:
            out += ["", f"where the ensemble's time goes ({r['variant']}, server, per request):", split]
    return "\n".join(out)


def _ratio(level: dict) -> str:
    if level["ratio"] is None:
        return "-"
    mark = "" if level["ratio"] >= TARGET_RATIO else "  BELOW TARGET"
    return f"{level['ratio']:.2f}x{mark}" + ("" if level["stable"] else " (not stable)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,4", help="concurrency levels, comma separated (default 1,4)")
    ap.add_argument("--seconds-per-level", type=float, default=8.0)
    ap.add_argument("--engine", default="auto", choices=("auto", "perf_analyzer", "python"))
    ap.add_argument("--no-default", action="store_true", help="skip the build with the default variants")
    ap.add_argument("--benchmark-seconds", type=float, default=None,
                    help="the default-variant build's measuring budget (build's default when unset)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (repositories, sweep files)")
    args = ap.parse_args()
    args.levels = [int(c) for c in args.levels.split(",") if c.strip()]
    host = host_profile(with_gpu=False)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    host_line = (f"{started}; host CPU: {host['cpu_model']}; ISA: {', '.join(host['isa_flags']) or '-'} "
                 f"({host['isa_class']}); {host['usable_cores']} usable cores; load average "
                 f"{' '.join(f'{v:.1f}' for v in os.getloadavg())} at start")
    print(host_line, flush=True)
    folder = sentiment_folder()
    sentences = texts()
    reference = library_reference(folder, sentences)
    work = Path(tempfile.mkdtemp(prefix="bench-hf-"))
    results = []
    try:
        plans = [("onnx", ["onnx"], 0.0)] + ([] if args.no_default else [("default", None, args.benchmark_seconds)])
        for label, variants, seconds in plans:
            repo = work / f"repo-{label}"
            began = time.monotonic()
            print(f"building {NAME} ({label} variants) ...", flush=True)
            build(EXAMPLE / "sentiment.yaml", repo, variants=variants, benchmark_seconds=seconds,
                  progress=print if args.verbose else None)
            build_s = time.monotonic() - began
            print(f"  built in {build_s:.0f} s; measuring ...", flush=True)
            result = measure(repo, label, sentences, reference, args, work)
            result.update({"build_s": build_s, "published": published_variant(repo)})
            results.append(result)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    host_line += f", {' '.join(f'{v:.1f}' for v in os.getloadavg())} at the end"
    print(table(results, host_line))
    if args.json:
        args.json.write_text(json.dumps({"host": host, "date": started, "results": results}, indent=2, default=str))
    below = [lv for r in results for lv in r["levels"] if lv["ratio"] is not None and lv["ratio"] < TARGET_RATIO]
    return 1 if below or any(lv["failures"] for r in results for lv in r["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
