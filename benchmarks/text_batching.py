"""Does a served text pipeline batch? Issue 51's targets, side by side in one run.

Builds the MiniLM sentiment example (examples/minilm/sentiment.yaml; its folder is made when missing) with the
onnx variant twice - as published (the model step takes ragged batches: builder/huggingface/ragged.py) and with
``deploy.ragged_batching: false`` (no benchmark, so its length buckets are kept) - then serves three layouts at
once (one embedded tritonserver each) and measures them in turns with perf_analyzer over gRPC, batch-1 requests
of the example's 58 texts (5 to 40 tokens: mixed lengths), at each concurrency level:

- ``ragged``: as published - the tokenizer pads each call to its longest text, and the model step's batcher
  merges requests of any length (each batch padded in the graph to its longest text);
- ``buckets``: ragged batching off - the tokenizer step pads to length buckets (templates/pipeline/text_steps.py);
- ``longest``: ragged batching and buckets off - requests of different lengths reach the model step with
  different shapes and Triton cannot batch them.

Each has the model step sized as a measured build sizes it (builder/core/host.py size_serving, from this run's
in-process batch-1 figure): the builds here skip their benchmark, and an unsized config serves one instance
with one intra-op thread.

For each: throughput, p99, and the batches the model step formed (Triton's statistics of ``<name>__model``);
the labels each answers vs transformers' ``pipeline`` on the same texts; and the model in-process (onnxruntime,
this host's usable cores, the same texts tokenized in batches of 1 to 16 padded to each batch's longest): texts/s
at its best batch. Targets, on the published layout (ragged): served >= 0.75x in-process at c=8 and c=16, avg
formed batch >= 2, p99 <= 100 ms (the default SLO of monitoring's alert rules); labels 100 % on every layout.
Last, what a build with ragged batching off decides on this host (builder/huggingface/texts.py bucket_decision).
Prints the CPU model and ISA flags first.

Usage: python benchmarks/text_batching.py [--levels 8,16] [--seconds-per-level 8] [--rounds 2] (make bench-text-batching)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from builder.core.host import host_profile, size_serving  # noqa: E402
from builder.pipeline import build  # noqa: E402
from builder.spec.model import load_spec  # noqa: E402
from builder.serving.embedded import EmbeddedServer  # noqa: E402
from builder.tuning.stats import format_batch_sizes  # noqa: E402
from builder.tuning.sweep import run_sweep  # noqa: E402
from builder.tuning.text_payload import write_texts_npz  # noqa: E402
from hf_pipeline import EXAMPLE, NAME, library_reference, sentiment_folder, served_answers, texts  # noqa: E402

TARGET_BATCH, TARGET_RATIO = 2.0, 0.75
TARGET_P99_MS = 100.0  # the default SLO: monitoring/prometheus/rules/alerts.yml TritonLatencyP99OverSLO


def without_buckets(repo: Path, target: Path) -> Path:
    """A copy of ``repo`` whose tokenizer step pads each call to its longest text (no length_buckets)."""
    shutil.copytree(repo, target, symlinks=True)
    config = target / f"{NAME}__preprocess" / "config.pbtxt"
    lines = config.read_text().splitlines(keepends=True)
    out, skip = [], 0
    for index, line in enumerate(lines):  # the block of length_buckets: 'parameters {', 'key: ...', 'value ...', '}'
        if skip:
            skip -= 1
            continue
        if line.strip() == "parameters {" and lines[index + 1].strip() == 'key: "length_buckets"':
            skip = 3
            continue
        out.append(line)
    config.write_text("".join(out))
    assert "length_buckets" not in config.read_text(), "the bucket parameter is still there"
    return target


def sized(repo: Path, instances: int, threads: int) -> Path:
    """``repo`` with its model step served by ``instances`` x ``threads`` intra-op threads."""
    config = repo / f"{NAME}__model" / "config.pbtxt"
    text = config.read_text()
    group = "instance_group {\n  kind: KIND_CPU\n  count: 1\n}"
    assert group in text, "the build's model step config changed: update sized()"
    text = text.replace(group, f"instance_group {{\n  kind: KIND_CPU\n  count: {instances}\n}}")
    config.write_text(text + f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{threads}" }} }}\n')
    return repo


def in_process(repo: Path, sentences: list[str], seconds: float = 2.0) -> dict[int, float]:
    """texts/s of the published model with onnxruntime, the texts tokenized in batches of b (padded to each
    batch's longest), at b = 1, 2, 4, 8, 16: the best 0.5 s window of ``seconds``."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from builder.core.host import usable_cores

    version = max((p for p in (repo / f"{NAME}__model").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = usable_cores()
    session = ort.InferenceSession(str(version / "model.onnx"), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    tokenizer = Tokenizer.from_file(str(repo / f"{NAME}__preprocess" / "1" / "tokenizer.json"))
    out = {}
    for batch in (1, 2, 4, 8, 16):
        feeds = []
        for start in range(0, len(sentences), batch):
            tokenizer.enable_padding()
            encoded = tokenizer.encode_batch(sentences[start:start + batch])
            values = {"input_ids": [e.ids for e in encoded], "attention_mask": [e.attention_mask for e in encoded],
                      "token_type_ids": [e.type_ids for e in encoded]}
            feeds.append(({n: np.array(values[n], dtype=np.int64) for n in names}, len(encoded)))
        best, ended, index = 0.0, time.monotonic() + seconds, 0
        while time.monotonic() < ended:
            began, done = time.monotonic(), 0
            while time.monotonic() - began < 0.5:
                feed, rows = feeds[index % len(feeds)]
                session.run(None, feed)
                done, index = done + rows, index + 1
            best = max(best, done / (time.monotonic() - began))
        out[batch] = best
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="8,16")
    ap.add_argument("--seconds-per-level", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2, help="measurements of each layout and level, in turns")
    args = ap.parse_args()
    levels = [int(c) for c in args.levels.split(",") if c.strip()]
    host = host_profile(with_gpu=False)
    print(f"host CPU: {host['cpu_model']}; ISA: {', '.join(host['isa_flags'])} ({host['isa_class']}); "
          f"{host['usable_cores']} usable cores; load average {os.getloadavg()[0]:.1f} at start", flush=True)
    folder = sentiment_folder()
    sentences = texts()
    ref_labels = library_reference(folder, sentences)[0]
    work = Path(tempfile.mkdtemp(prefix="bench-text-batching-"))
    try:
        published = work / "ragged"
        build(EXAMPLE / "sentiment.yaml", published, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
        spec = load_spec(EXAMPLE / "sentiment.yaml")
        spec = dataclasses.replace(spec, deploy=dataclasses.replace(spec.deploy, ragged_batching=False))
        repo = work / "buckets"
        build(spec, repo, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
        assert "allow_ragged_batch" in (published / f"{NAME}__model" / "config.pbtxt").read_text(), \
            "the published model step does not take ragged batches"
        params = (repo / f"{NAME}__preprocess" / "config.pbtxt").read_text()
        model_config = (repo / f"{NAME}__model" / "config.pbtxt").read_text()
        print("buckets (ragged batching off):", params.split('key: "length_buckets"')[1].split('"')[1], flush=True)
        delay = model_config.split("max_queue_delay_microseconds:")[1].split()[0] if \
            "max_queue_delay_microseconds" in model_config else "0"
        print(f"model step: max_queue_delay_microseconds {delay}", flush=True)
        speed = in_process(repo, sentences)
        cores = host["usable_cores"]
        size = size_serving(cores, 1.0 / speed[1])
        longest = without_buckets(repo, work / "longest")
        repos = {"ragged": sized(published, *size), "buckets": sized(repo, *size), "longest": sized(longest, *size)}
        print(f"model step: {size[0]} instance(s) x {size[1]} thread(s), as a measured build sizes it", flush=True)
        from tokenizers import Tokenizer

        from builder.huggingface.texts import bucket_decision
        tokenizer = Tokenizer.from_file(str(repo / f"{NAME}__preprocess" / "1" / "tokenizer.json"))
        tokenizer.no_padding()
        lengths = [len(e.ids) for e in tokenizer.encode_batch(sentences)]
        buckets = [int(b) for b in params.split('key: "length_buckets"')[1].split('"')[1].split(",")]
        kept, decision = bucket_decision(lengths, buckets, speed)
        best_batch = max(speed, key=speed.get)
        print("in-process texts/s by batch: " + ", ".join(f"b{b} {v:.0f}" for b, v in speed.items()), flush=True)
        payload = write_texts_npz(work / "texts.npz", "text", sentences)
        figures: dict[tuple[str, int], list[dict]] = {}
        labels = {}
        servers = {name: EmbeddedServer(path, ready_timeout=240) for name, path in repos.items()}
        try:
            for server in servers.values():
                server.start()
            for name, server in servers.items():
                got = served_answers(f"127.0.0.1:{server.grpc_port}", sentences)[0]
                labels[name] = 100.0 * float(np.mean([a == b for a, b in zip(got, ref_labels)]))
            for round_number in range(args.rounds):
                for name, server in servers.items():
                    swept = run_sweep(NAME, f"127.0.0.1:{server.grpc_port}", "grpc", levels=levels, payload=payload,
                                      out_dir=work / "sweeps" / f"{name}-{round_number}", engine="perf_analyzer",
                                      max_seconds_per_level=args.seconds_per_level)
                    for row in swept["levels"]:
                        figures.setdefault((name, row["concurrency"]), []).append(row)
                        print(f"  {name} round {round_number} c={row['concurrency']}: {row['throughput_rps']:.1f} "
                              f"req/s, p99 {row['p99_ms']:.1f} ms, model step "
                              f"{format_batch_sizes(row.get('model_step_batch_sizes') or {}, 5)} "
                              f"(avg {row.get('model_step_avg_batch') or 0:.2f})", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [["layout", "c", "req/s (median)", "p99 ms", "model step avg batch", "formed batches (last round)",
             f"/ in-process b{best_batch} ({speed[best_batch]:.0f}/s)", "labels = pipeline"]]
    below = False
    for name in repos:
        for level in levels:
            runs = figures[(name, level)]
            rps = statistics.median(r["throughput_rps"] for r in runs)
            avg = statistics.median(r.get("model_step_avg_batch") or 0 for r in runs)
            ratio = rps / speed[best_batch]
            p99 = statistics.median(r["p99_ms"] for r in runs)
            if name == "ragged" and (ratio < TARGET_RATIO or avg < TARGET_BATCH or p99 > TARGET_P99_MS):
                below = True
            rows.append([name, str(level), f"{rps:.1f}", f"{p99:.1f}",
                         f"{avg:.2f}", format_batch_sizes(runs[-1].get("model_step_batch_sizes") or {}, 5),
                         f"{ratio:.2f}x", f"{labels[name]:.1f} %"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for index, row in enumerate(rows):
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if index == 0:
            print("-+-".join("-" * w for w in widths))
    print(f"\ntargets, on the published layout (ragged): >= {TARGET_RATIO}x in-process at its best batch, avg "
          f"formed batch >= {TARGET_BATCH}, p99 <= {TARGET_P99_MS:.0f} ms (the default SLO), labels 100 %: "
          f"{'not met' if below else 'met'}; load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"a measured build with ragged batching off, on this host: {decision}")
    return 1 if below or any(v < 100.0 for v in labels.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
