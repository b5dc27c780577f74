"""Issue 14's serving targets, measured with Triton's perf_analyzer against the embedded tritonserver.

For each model (default: examples/convnet64, a compute-bound conv net; examples/digits, overhead-bound:
~0.05 ms of compute per sample) this builds the ONNX variant with a short benchmark into a temporary
repository - the DEFAULT published config, sized by the build to this host (instances x intra-op
threads, batching delay) - serves it on the embedded tritonserver and measures it with perf_analyzer
(builder/tuning/engine.py, batch-1 requests from reference.npz, time windows until stable) over gRPC at
concurrency 1 and 16 and over HTTP at 16 (the protocols' own costs differ: on 2 shared cores HTTP left the
model ~5 % more CPU than gRPC), and with the in-process Python client at 16 (our client vs perf_analyzer on
the same server). Then ``triton-builder tune`` searches the served model (p99 budget: 1.25x the default's
p99 at c=16, at least 10 ms; ``--tune-seconds`` per candidate, 0 to skip), its winner is written and served,
and measured the same way: "served tuned". The in-process figure: onnxruntime with all usable cores,
samples/s at the best of batch 1, the build's best batch, max/4 and max, measured by this script just before
serving (best 1 s window). Where the build sized a batching delay, the same config with delay 0 is measured
too. Targets (issue 14): served default / in-process >= 0.85 for the conv net, tuned >= 0.9; >= 5,000 req/s
at p99 <= 10 ms at concurrency 16 for digits.

Two core layouts (``--layouts``, default both where this process may use 2 cores or more):
- ``shared``: client and server share every usable core, as on a single host. The figures are this
  machine's, with the load average around them, and where the CPU went during each measurement
  (``CpuAccount``: the model's stubs, tritonserver, the load generator, the rest) - what the server's own
  frontend and the client take is the ceiling of served / in-process on a shared host.
- ``split``: the usable cores cut in two; the build (so its sizing), the in-process figure and
  tritonserver with its stubs run on the first half, perf_analyzer and the Python client on the second
  (every thread of this process is pinned; children inherit it). That is the comparison the ratio
  targets mean: the server's cores against the same cores in-process, the load generator elsewhere, as
  on a real deployment. On a 2-core host: one core each.
Prints the CPU model and ISA flags first, then one JSON line per measurement and a table.

Usage: python benchmarks/serving_targets.py [--models convnet64,digits] [--seconds 8] [--window 0.5]
                                            [--tune-seconds 6] [--layouts shared,split]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO, TARGET_TUNED_RATIO = 0.85, 0.9
TARGET_RPS, TARGET_P99_MS = 5000.0, 10.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="convnet64,digits", help="examples/<name>/spec.yaml, comma-separated")
    ap.add_argument("--seconds", type=float, default=8.0, help="time cap per measured level")
    ap.add_argument("--window", type=float, default=0.5, help="measurement window (s)")
    ap.add_argument("--benchmark-seconds", type=float, default=1.0, help="the build's in-process benchmark cap")
    ap.add_argument("--tune-seconds", type=float, default=6.0,
                    help="tune's seconds per candidate (0: no tune, no 'served tuned' figures)")
    ap.add_argument("--layouts", default=None,
                    help="shared and/or split, comma-separated (default: both where 2+ cores are usable)")
    args = ap.parse_args(argv)
    from builder.core.host import host_profile
    from builder.core.local_server import pin_process, split_cores
    from builder.tuning.engine import choose_engine

    host = host_profile()
    print(f"host: {host['cpu_model']}; ISA flags {' '.join(host['isa_flags'])} (class {host['isa_class']}); "
          f"usable cores {host['usable_cores']}; shared host: other processes may take CPU", flush=True)
    engine = choose_engine("perf_analyzer", print)
    everything = sorted(os.sched_getaffinity(0))
    layouts = ([x.strip() for x in args.layouts.split(",") if x.strip()] if args.layouts
               else ["shared", "split"] if host["usable_cores"] >= 2 and len(everything) >= 2 else ["shared"])
    for layout in layouts:
        if layout not in ("shared", "split"):
            ap.error(f"--layouts: unknown layout {layout!r}; use shared and/or split")
    rows = []
    for layout in layouts:
        cores = split_cores(everything, host["usable_cores"]) if layout == "split" else None
        if cores:
            print(f"layout split: server on cores {_cpus(cores[0])}, load generator on cores {_cpus(cores[1])}",
                  flush=True)
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            work = Path(tempfile.mkdtemp(prefix="serving-targets-"))
            try:
                rows.append(_model(name, work, engine, args, cores))
            finally:
                shutil.rmtree(work, ignore_errors=True)
                pin_process(everything)
    _table(rows, host)
    return 0


def _cpus(cpus) -> str:
    return ",".join(map(str, cpus))


def _model(name: str, work: Path, engine, args, cores: tuple[list[int], list[int]] | None = None) -> dict:
    """One model measured; ``cores`` (server cores, client cores): the split layout, else shared."""
    import yaml

    from builder.core.errors import ServerError
    from builder.core.local_server import pin_process
    from builder.model.measure import load_average
    from builder.pipeline import build
    from builder.serving.embedded import EmbeddedServer
    from builder.tuning.engine import PythonEngine, choose_engine
    from builder.tuning.payload import fetch_model, load_samples, make_requests
    from builder.tuning.stats import StatsReader

    if cores:
        pin_process(cores[0])  # the build sizes its default config to the server's cores
    repo = work / "model_repository"
    result = build(ROOT / "examples" / name / "spec.yaml", repo, variants=["onnx"],
                   benchmark_seconds=args.benchmark_seconds, progress=lambda m: None)
    model = result.published[0]["name"]
    meta = yaml.safe_load((repo / model / "1" / "metadata.yaml").read_text())
    bench, serving = meta.get("benchmark") or {}, meta.get("serving") or {}
    row = {"model": model, "instances": serving.get("instances"), "threads": serving.get("intra_op_threads"),
           "delay_us": serving.get("max_queue_delay_microseconds"), "sized": serving.get("sized"),
           "delay_sized": serving.get("delay_sized"), "in_process_best": bench.get("best_throughput"),
           "build_best_batch": bench.get("best_batch"), "in_process_runtime": bench.get("runtime"),
           "load_before": load_average(), "layout": f"split {len(cores[0])}/{len(cores[1])}" if cores else "shared",
           "server_cores": len(cores[0]) if cores else None}
    max_batch = int(meta["spec"].get("max_batch_size") or 1)
    batches = sorted({1, int(bench.get("best_batch") or 1), max(1, max_batch // 4), max_batch})
    measured = {b: _in_process(repo, model, meta, b, max(2.0, args.seconds / len(batches))) for b in batches}
    row["in_process_batch"] = max(measured, key=measured.get)
    row["in_process_now"] = measured[row["in_process_batch"]]
    row["in_process_by_batch"] = measured
    print(json.dumps({k: row[k] for k in ("model", "instances", "threads", "delay_us", "in_process_best",
                                          "in_process_batch", "in_process_now")}), flush=True)
    with EmbeddedServer(repo, load_models=[model], ready_timeout=90) as server:
        if cores:
            pin_process(cores[1])  # tritonserver (and the stubs it starts later) keep the server's cores
        url = server.grpc_url
        interface = fetch_model(url, "grpc", model)
        samples, _ = load_samples(interface, None, repo)
        requests = make_requests(samples, 1, interface.batching)
        stats = StatsReader(url, "grpc")
        python, http = PythonEngine(), choose_engine("perf_analyzer")  # a second one: it keeps its own protocol
        for meter, where, protocol in ((engine, url, "grpc"), (python, url, "grpc"), (http, server.http_url, "http")):
            meter.prepare(where, protocol, interface, samples, requests, batch_size=1, work_dir=work / f"pa_{protocol}")
        levels = (("pa_c1", engine, 1), ("pa_c16", engine, 16), ("pa_http_c16", http, 16), ("python_c16", python, 16))
        try:
            for label, meter, concurrency in levels:
                row[label] = _level(meter, concurrency, args, stats)
                print(json.dumps({"model": model, "measure": label, **row[label]}), flush=True)
            if row["delay_us"]:  # did the sized delay pay? the same config with delay 0, side by side
                from builder.repository.config import config_as_dict
                from builder.tuning.search import ModelControl

                config = config_as_dict((repo / model / "config.pbtxt").read_text())
                config["dynamic_batching"]["max_queue_delay_microseconds"] = "0"
                control = ModelControl(url, "grpc", model)
                control.load(config)
                row["pa_c16_delay0"] = _level(engine, 16, args, stats)
                control.load(None)  # back to the published config
                control.close()
                print(json.dumps({"model": model, "measure": "pa_c16 with delay 0", **row["pa_c16_delay0"]}),
                      flush=True)
            if args.tune_seconds > 0:
                try:
                    row.update(_tuned(model, repo, url, work, engine, http, stats, args, row["pa_c16"]["p99_ms"],
                                      row["server_cores"]))
                except ServerError as exc:  # the default's figures stand; the table says what happened to tune
                    row["tune_error"] = " ".join(str(exc).split())[:300]
                    print(json.dumps({"model": model, "tune_failed": row["tune_error"]}), flush=True)
        finally:
            stats.close()
    row["load_after"] = load_average()
    return row


def _level(meter, concurrency: int, args, stats) -> dict:
    """One closed-loop level with where the CPU went during it."""
    with CpuAccount() as account:
        level = meter.measure(concurrency, window_s=args.window, max_s=args.seconds, stats=stats)
    return {"rps": round(level.throughput, 1), "p50_ms": level.p50_ms and round(level.p50_ms, 2),
            "p99_ms": level.p99_ms and round(level.p99_ms, 2), "stable": level.stable, "failures": level.failures,
            "avg_batch": level.server.get("average_batch_size"), "queue_us": level.server.get("queue_us_per_request"),
            "compute_us": level.server.get("compute_us_per_request"), "cpu_cores": account.cores}


def _tuned(model: str, repo: Path, url: str, work: Path, engine, http, stats, args, default_p99_ms,
           server_cores: int | None = None) -> dict:
    """`triton-builder tune` on the served model (p99 budget: the default's p99 at c=16 x 1.25, at least 10
    ms), its winner written and served, then measured like the default: c=16 over gRPC and HTTP."""
    import time

    from builder.tuning.tune import run_tune

    budget = max(10.0, round(1.25 * (default_p99_ms or 0.0), 1))
    began = time.perf_counter()
    record = run_tune(model, repo, url, p99_budget_ms=budget, seconds_per_candidate=args.tune_seconds, write=True,
                      out_dir=work / "tune", engine=engine.name, usable_cores=server_cores,
                      progress=lambda m: print(f"  [tune {time.perf_counter() - began:5.0f} s] {m}", flush=True))
    out = {"tune_budget_ms": budget, "tune_s": round(time.perf_counter() - began, 1),
           "tuned": (record.get("winner") or {}).get("label"), "tune_summary": record.get("summary")}
    for label, meter in (("tuned_pa_c16", engine), ("tuned_pa_http_c16", http)):
        out[label] = _level(meter, 16, args, stats)
        print(json.dumps({"model": model, "measure": label, **out[label]}), flush=True)
    return out


class CpuAccount:
    """Where the host's CPU went while a block ran: the model's python-backend stubs, tritonserver
    itself (frontends, batcher, copies into the stubs' shared memory), the load generator (children
    of this process: perf_analyzer) and everything else (kernel workers, other processes), in cores.
    Linux /proc; empty elsewhere."""

    def __enter__(self):
        import resource
        import time

        self.began, self.children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        self.ticks = _ticks_by_process()
        return self

    def __exit__(self, *exc):
        import resource
        import time

        seconds = time.perf_counter() - self.began
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        after, hz = _ticks_by_process(), os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        used = {"stubs": 0.0, "tritonserver": 0.0, "client": 0.0, "other": 0.0}
        for key, ticks in after.items():
            delta = (ticks - self.ticks.get(key, ticks)) / hz / seconds
            name = key[1]
            group = ("client" if key[0] == str(os.getpid()) else "stubs" if name.startswith("triton_python")
                     else "tritonserver" if name == "tritonserver" else "other")
            used[group] += max(0.0, delta)
        # perf_analyzer runs as a child and is gone by now (its ticks with it): its rusage; the Python
        # client is this process
        used["client"] += ((children.ru_utime + children.ru_stime) - (self.children.ru_utime + self.children.ru_stime)) \
            / seconds
        self.cores = {k: round(v, 2) for k, v in used.items()}
        return False


def _ticks_by_process() -> dict:
    """{(pid, name): user+system ticks} of every process now (Linux /proc; {} elsewhere)."""
    out = {}
    for pid in (os.listdir("/proc") if os.path.isdir("/proc") else []):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[(pid, stat[stat.index("(") + 1:stat.rindex(")")])] = int(fields[11]) + int(fields[12])
    return out


def _in_process(repo: Path, model: str, meta: dict, batch: int, seconds: float) -> float:
    """Samples/s of the published model in-process (onnxruntime, all usable cores) at ``batch``, now: the
    best of 1 s windows over ``seconds`` (the build's own figure had a short cap, at another moment)."""
    import time

    import numpy as np

    from builder.core.host import usable_cores
    from builder.repository.metadata import read_reference
    from builder.model.runtime import open_runner

    folder = repo / model / "1"
    artifact = meta["artifact"]
    runner = open_runner(artifact["format"], folder / artifact["file"], [o["name"] for o in meta["spec"]["outputs"]],
                         [i["name"] for i in meta["spec"]["inputs"]], threads=usable_cores())
    cases, _ = read_reference(folder / "reference.npz")
    first = cases[-1]["inputs"]  # the largest case: reference cases grow to max_batch_size
    feeds = {n: np.resize(a, (batch, *a.shape[1:])).astype(a.dtype) for n, a in first.items()}
    runner(feeds)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < 1.0:
            runner(feeds)
            count += batch
        best = max(best, count / (time.perf_counter() - start))
    return round(best, 1)


def _table(rows: list[dict], host: dict) -> None:
    print()
    print(f"CPU {host['cpu_model']} | flags {' '.join(host['isa_flags'])} | usable cores {host['usable_cores']} | "
          "perf_analyzer 2.51, batch-1 requests, concurrency 16 unless said, shared host")
    head = (f"{'model':<10} {'cores':<9} {'config':<17} {'in-process':>16} {'gRPC c=1':>9} {'gRPC':>7} {'p99 ms':>7} {'avg b':>5} "
            f"{'HTTP':>7} {'p99 ms':>7} {'served/in-proc':>18} {'py gRPC':>8} {'py/PA':>6} {'load':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        for tuned in ("", "tuned_"):
            pa, web = r.get(f"{tuned}pa_c16"), r.get(f"{tuned}pa_http_c16")
            if pa is None:
                continue
            one, py = r["pa_c1"], r["python_c16"]
            config = f"{r['instances']}x{r['threads']} d={r['delay_us']}us" if not tuned else f"tuned: {r['tuned']}"
            inproc = f"{r['in_process_now'] or 0:.0f}/s @b{r['in_process_batch']}"
            ratios = f"{_ratio(pa, r):.2f} / {_ratio(web, r):.2f}"
            print(f"{r['model']:<10} {r['layout']:<9} {config[:17]:<17} {inproc:>16} {one['rps'] if not tuned else float('nan'):>9.0f} "
                  f"{pa['rps']:>7.0f} {pa['p99_ms'] or 0:>7.2f} {pa['avg_batch'] or 0:>5.1f} {web['rps']:>7.0f} "
                  f"{web['p99_ms'] or 0:>7.2f} {ratios:>18} "
                  f"{py['rps'] if not tuned else float('nan'):>8.0f} "
                  f"{py['rps'] / pa['rps'] if pa['rps'] and not tuned else float('nan'):>6.2f} "
                  f"{r['load_before']}->{r['load_after']}")
    print("(served/in-proc: gRPC / HTTP; cores: shared = client and server on every core, split S/C = the server "
          "and the in-process figure on S cores, the load generator on the other C)")
    print()
    for r in rows:
        pa, web = r["pa_c16"], r["pa_http_c16"]
        if r["model"].startswith("digits"):
            for protocol, level in (("gRPC", pa), ("HTTP", web)):
                met = level["rps"] >= TARGET_RPS and (level["p99_ms"] or 1e9) <= TARGET_P99_MS
                print(f"target digits ({r['layout']}): >= {TARGET_RPS:.0f} req/s at p99 <= {TARGET_P99_MS:g} ms, c=16, default config, "
                      f"{protocol}: {level['rps']:.0f} req/s, p99 {level['p99_ms']} ms -> {'MET' if met else 'NOT met'}")
        else:
            for what, target, prefix in (("default", TARGET_RATIO, ""), ("tuned", TARGET_TUNED_RATIO, "tuned_")):
                if r.get(f"{prefix}pa_c16") is None:
                    continue
                for protocol, level in (("gRPC", r[f"{prefix}pa_c16"]), ("HTTP", r[f"{prefix}pa_http_c16"])):
                    ratio = _ratio(level, r)
                    print(f"target {r['model']} ({r['layout']}): served {what} / in-process best >= {target} over {protocol}: "
                          f"{ratio:.2f} -> {'MET' if ratio >= target else 'NOT met'}")
        print(f"  {r['model']} sizing: {r['sized']}; {r['delay_sized']}")
        if r.get("tune_error"):
            print(f"  {r['model']} tune failed (no 'served tuned' figures): {r['tune_error']}")
        if r.get("tune_summary"):
            print(f"  {r['model']} tune ({r['tune_s']} s, p99 budget {r['tune_budget_ms']} ms): {r['tune_summary']}")
        print(f"  {r['model']} in-process samples/s by batch, measured now: {r['in_process_by_batch']}; the build's "
              f"benchmark: {r['in_process_best']}/s at batch {r['build_best_batch']}")
        for protocol, level in (("gRPC", pa), ("HTTP", web)):
            cpu = level.get("cpu_cores") or {}
            if cpu and r["layout"] == "shared":
                spare = host["usable_cores"] - cpu.get("tritonserver", 0) - cpu.get("client", 0)
                print(f"  {r['model']} CPU at PA c=16 over {protocol}, cores of {host['usable_cores']}: model stubs "
                      f"{cpu.get('stubs')}, tritonserver {cpu.get('tritonserver')}, perf_analyzer {cpu.get('client')}, "
                      f"other {cpu.get('other')} -> what the server's frontend and the client leave the model: "
                      f"{spare / host['usable_cores']:.2f} of the host (the ceiling of served / in-process here)")
        if r.get("pa_c16_delay0"):
            print(f"  {r['model']} sized delay {r['delay_us']} us: {pa['rps']:.0f} req/s p99 {pa['p99_ms']} ms; "
                  f"delay 0: {r['pa_c16_delay0']['rps']:.0f} req/s p99 {r['pa_c16_delay0']['p99_ms']} ms")


def _ratio(level: dict | None, row: dict) -> float:
    return level["rps"] / row["in_process_now"] if level and row.get("in_process_now") else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
