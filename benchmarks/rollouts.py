"""What clients see while new versions and rollbacks land under steady load (issue 36): digits_cnn served by the
embedded tritonserver, steady closed-loop gRPC load at concurrency 16, through N rollouts (a new version
published: `tune --publish`'s republish of the served files and config) and N rollbacks (`triton-builder
rollback`), in poll mode (Triton notices the config change itself) and in explicit model control (the operator
loads the model again after the change). Prints failed requests, p99 during vs outside a switch, how long each
switch took to be served, and which version answered each second (the responses' model_version).

The load is the project's Python client (builder/tuning/steady.py): perf_analyzer reports no per-request
model_version. ``--modes replicas``: ``--replicas`` embedded servers behind nginx (builder/scaleout/replicas.py), each
switch rolled out one replica at a time (``ReplicaSet.roll_out``: taken out of nginx's rotation, reloaded, ready, the
served check passed, put back), the load sent to nginx; the whole roll-out is the switch window.

Usage: python benchmarks/rollouts.py [--rollouts 10] [--rollbacks 10] [--concurrency 16]
                                     [--modes poll,explicit,replicas] [--replicas 2] [--gap 3] [--timeline] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from builder.repository.republish import publish_tuned  # noqa: E402
from builder.repository.rollback import rollback_model  # noqa: E402
from builder.serving.embedded import EmbeddedServer  # noqa: E402
from builder.tuning.steady import SteadyLoad, Switch, summarise  # noqa: E402

MODEL = "digits_cnn"


def rollout(repo: Path) -> str:
    """A new version: the served one's files and config published again (what `tune --publish` does)."""
    text = (repo / MODEL / "config.pbtxt").read_text()
    return str(publish_tuned(repo, MODEL, text, {"benchmark": "rollouts"})["version"])


def run_mode(mode: str, source: Path, work: Path, args) -> dict:
    repo = work / f"repo_{mode}"
    shutil.copytree(source, repo)
    sample = np.load(ROOT / "examples" / "digits" / "data" / "val.npz")["image"][:8].astype(np.float32)
    requests = [{"image": sample[i:i + 1]} for i in range(len(sample))]
    extra = [f"--repository-poll-secs={args.poll_secs:g}"] if mode == "poll" else []
    plan = ["rollout", "rollback"] * min(args.rollouts, args.rollbacks)
    plan += ["rollout"] * (args.rollouts - args.rollbacks) + ["rollback"] * (args.rollbacks - args.rollouts)
    switches: list[Switch] = []
    if mode == "replicas":
        return run_replicas(repo, requests, plan, args)
    with EmbeddedServer(repo, model_control=mode, extra_args=extra, ready_timeout=120) as server:
        with SteadyLoad(server.grpc_url, "grpc", MODEL, requests, concurrency=args.concurrency) as load:
            time.sleep(args.gap)
            for kind in plan:
                began = time.time()
                if kind == "rollout":
                    target = rollout(repo)
                else:
                    target = str(rollback_model(repo, MODEL).to_version)
                if mode == "explicit":
                    server.load_model(MODEL)  # Triton loads the new version, then unloads the old
                ended = load.wait_for_version(target, timeout=60, since=began)
                switches.append(Switch(kind, began, ended, target))
                print(f"  [{mode}] {kind:<8} -> version {target}: "
                      f"{'served after %.2f s' % (ended - began) if ended else 'NOT served within 60 s'}", flush=True)
                time.sleep(args.gap)
        summary = summarise(load.records, switches)
    return {"mode": mode, "summary": summary}


def run_replicas(repo: Path, requests, plan: list[str], args) -> dict:
    """Each switch rolled out replica by replica behind nginx, gated by readiness and the served check."""
    from builder.scaleout.replicas import ReplicaSet

    switches: list[Switch] = []
    with ReplicaSet(repo, replicas=args.replicas, prometheus=False) as group:
        with SteadyLoad(group.grpc_url, "grpc", MODEL, requests, concurrency=args.concurrency) as load:
            time.sleep(args.gap)
            for kind in plan:
                began = time.time()
                target = rollout(repo) if kind == "rollout" else str(rollback_model(repo, MODEL).to_version)
                steps = group.roll_out(MODEL)  # one replica at a time; RolloutError if a check fails
                seen = load.wait_for_version(target, timeout=30, since=began)
                ended = time.time() if seen else None
                switches.append(Switch(kind, began, ended, target))
                print(f"  [replicas x{args.replicas}] {kind:<8} -> version {target}: "
                      + ", ".join(f"#{s.replica} {s.status} {s.seconds:.1f} s" for s in steps), flush=True)
                time.sleep(args.gap)
        summary = summarise(load.records, switches)
    return {"mode": f"replicas x{args.replicas} behind nginx", "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=10)
    ap.add_argument("--rollbacks", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--modes", default="poll,explicit")
    ap.add_argument("--replicas", type=int, default=2, help="replicas behind nginx in the replicas mode")
    ap.add_argument("--gap", type=float, default=3.0, help="seconds of steady load between switches")
    ap.add_argument("--poll-secs", type=float, default=1.0, help="--repository-poll-secs in poll mode")
    ap.add_argument("--timeline", action="store_true", help="print which version answered each second")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    from builder.core.host import host_profile
    from builder.pipeline import build

    host = host_profile(with_gpu=False)
    print(f"host: {host['cpu_model']}; ISA flags: {', '.join(host['isa_flags'])}; usable cores {host.get('usable_cores')}")
    work = Path(tempfile.mkdtemp(prefix="rollouts-bench-"))
    try:
        source = work / "built"
        build(ROOT / "examples" / "digits" / "spec.yaml", source, variants=["onnx"], benchmark_seconds=0,
              progress=lambda m: None)
        results = []
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            print(f"{mode} mode: {args.rollouts} rollouts, {args.rollbacks} rollbacks, concurrency {args.concurrency}",
                  flush=True)
            results.append(run_mode(mode, source, work, args))
        print()
        worst_ratio = 0.0
        for item in results:
            summary = item["summary"]
            print(f"== {item['mode']} mode ==")
            print("\n".join(summary.lines(timeline=args.timeline)))
            worst_ratio = max(worst_ratio, summary.p99_ratio or 0.0)
        failed = sum(item["summary"].failed for item in results)
        print(f"\ntotal failed requests: {failed}; worst p99 during/outside a switch: {worst_ratio:.2f}x "
              "(target: 0 failed, <= 2x)")
        if args.json:
            from dataclasses import asdict
            Path(args.json).write_text(json.dumps({"host": host, "results": [
                {"mode": r["mode"], **asdict(r["summary"])} for r in results]}, indent=1, default=str))
        return 0 if failed == 0 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
