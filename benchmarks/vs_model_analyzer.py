"""`triton-builder tune` against Triton Model Analyzer, side by side: same server binary, same perf_analyzer.

Builds an example (default: convnet64, a compute-bound conv net; digits is the overhead-bound one) with
its default published config, then:

1. Model Analyzer 1.58 (its own virtualenv under ~/.cache/triton-builder/tools, installed on first
   use from PyPI: it pins its own tritonclient) runs a quick search in local launch mode against the
   embedded tritonserver, with perf_analyzer 2.51 (builder/tuning/perf_analyzer.py) and concurrency
   up to --max-concurrency; its best config by throughput is read from its results CSV.
2. `triton-builder tune` searches the same model under a p99 budget equal to Model Analyzer's best
   p99 (so "better" means more throughput at no worse tail latency), with the perf_analyzer engine.
3. The default config, Model Analyzer's best and tune's winner are served side by side (one server,
   a copy of the model per distinct config: one that two of them share is measured once, reported for
   both) and measured by perf_analyzer at each of --concurrencies and where Model
   Analyzer's pick and tune's winner scored, in --rounds
   interleaved rounds. Two tables: the median throughput and p99 of each config at each concurrency,
   and the issue's comparison - each config's best median throughput at a concurrency whose median
   p99 is within Model Analyzer's best p99 (the budget tune searched under; one fixed concurrency would
   compare the configs at a point none of them chose) - with the wall time of each search and the
   in-process best of the same variant (from the build's own benchmark).

``--layout split`` (the default where 2+ cores are usable): the build (so its sizing), every tritonserver
(Model Analyzer's, through a wrapper that pins it, and ours) on the first half of the usable cores,
perf_analyzer, Model Analyzer and tune on the other half (builder/core/local_server.py ``split_cores``):
the clients off the server's cores, as in production. ``--layout shared``: everything on every core.
Run it on a quiet machine. The CPU model and ISA flags are printed first.

Usage: python benchmarks/vs_model_analyzer.py [--example convnet64] [--max-concurrency 16] [--concurrencies 8,12,16]
       [--rounds 3] [--window-ms 2000] [--layout split|shared] [--keep]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MA_VERSION = "1.58.0"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default="convnet64", help="examples/<name>/spec.yaml (default: %(default)s)")
    ap.add_argument("--max-concurrency", type=int, default=16)
    ap.add_argument("--concurrencies", default="8,12,16", help="the side-by-side measurement's concurrencies")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer's measurement window")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (configs, MA's reports)")
    ap.add_argument("--layout", choices=("split", "shared"),
                    help="split: servers on half the usable cores, the clients on the rest (default where 2+ cores "
                         "are usable); shared: all on every core")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vs-model-analyzer-"))
    try:
        return run(args, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def model_analyzer_python(say) -> Path:
    """The interpreter of a cached virtualenv with triton-model-analyzer (builder/core/side_env.py, first use)."""
    from builder.core.side_env import cache_root, cached_virtualenv

    home = cache_root() / "tools" / f"model-analyzer-{MA_VERSION}"
    if not (home / "ready").is_file():
        say(f"installing triton-model-analyzer {MA_VERSION} into {home} (once) ...")
    return cached_virtualenv(home, [f"triton-model-analyzer=={MA_VERSION}"], 1200)


def run(args, work: Path) -> int:
    import yaml

    from builder.core.host import host_profile
    from builder.core.local_server import pin_process, split_cores
    from builder.pipeline import build
    from builder.core.processes import free_ports, run_command
    from builder.serving.install import build_backend_dir, find_tritonserver, server_environment
    from builder.tuning.perf_analyzer import install_perf_analyzer

    say = lambda line: print(line, flush=True)  # noqa: E731
    host = host_profile(with_gpu=False)
    say(f"host: {host.get('cpu_model')} | ISA {' '.join(host.get('isa_flags') or [])} | "
        f"usable cores {host.get('usable_cores')}")
    everything = sorted(os.sched_getaffinity(0))
    cores = split_cores(everything, host["usable_cores"]) if args.layout in (None, "split") else None
    if args.layout == "split" and cores is None:
        raise SystemExit("--layout split needs 2 or more usable cores")
    server_cpus, client_cpus = cores or (everything, everything)
    listed = lambda cpus: ",".join(map(str, cpus))  # noqa: E731
    say(f"layout: split, servers on cores {listed(server_cpus)}, clients on {listed(client_cpus)}" if cores
        else "layout: shared")
    pin_process(server_cpus)  # the build sizes the default config to the server's cores
    spec = ROOT / "examples" / args.example / "spec.yaml"
    name = yaml.safe_load(spec.read_text())["name"]
    repo = work / "model_repository"
    say(f"building {args.example} (onnx, default published config) ...")
    result = build(spec, repo, variants=["onnx"], progress=lambda m: None)
    meta = yaml.safe_load((Path(result.published[0]["path"]) / "metadata.yaml").read_text())
    in_process = (meta.get("benchmark") or {}).get("best_throughput")
    tool = install_perf_analyzer(progress=say)
    python = model_analyzer_python(say)

    # 1. Model Analyzer, quick search, local launch mode on the embedded tritonserver
    install = find_tritonserver()
    backends = build_backend_dir(install, work / "backends")
    wrapper = work / "perf_analyzer"
    env_lines = "".join(f"export {k}='{v}'\n" for k, v in tool.environment().items() if k == "LD_LIBRARY_PATH")
    wrapper.write_text(f"#!/bin/sh\n{env_lines}exec {pinned_exec(client_cpus)} '{tool.binary}' \"$@\"\n")
    wrapper.chmod(0o755)
    server_wrapper = work / "tritonserver"  # Model Analyzer starts it: pinned to the server's cores
    server_wrapper.write_text(f"#!/bin/sh\nexec {pinned_exec(server_cpus)} '{install.binary}' \"$@\"\n")
    server_wrapper.chmod(0o755)
    pin_process(client_cpus)
    ports = free_ports("127.0.0.1", 3)
    environment = server_environment(install)
    config = {
        "model_repository": str(repo), "profile_models": {name: {"cpu_only": True}},
        "run_config_search_mode": "quick", "run_config_search_max_concurrency": args.max_concurrency,
        "triton_launch_mode": "local", "triton_server_path": str(server_wrapper),
        "triton_server_flags": {"backend-directory": str(backends), "http-address": "127.0.0.1",
                                "grpc-address": "127.0.0.1", "metrics-address": "127.0.0.1"},
        "triton_server_environment": {k: environment[k] for k in ("LD_LIBRARY_PATH", "PATH") if k in environment},
        "perf_analyzer_path": str(wrapper), "client_protocol": "grpc",
        "triton_http_endpoint": f"127.0.0.1:{ports[0]}", "triton_grpc_endpoint": f"127.0.0.1:{ports[1]}",
        "triton_metrics_url": f"http://127.0.0.1:{ports[2]}/metrics",
        "output_model_repository_path": str(work / "ma_models"), "override_output_model_repository": True,
        "export_path": str(work / "ma_export"), "checkpoint_directory": str(work / "ma_checkpoints"),
    }
    (work / "ma_export").mkdir()
    (work / "ma.yaml").write_text(yaml.safe_dump(config))
    say("Model Analyzer: quick search ...")
    started = time.perf_counter()
    done = run_command([python, "-c", "import sys; from model_analyzer.entrypoint import main; "
                        "sys.argv[0] = 'model-analyzer'; sys.exit(main())", "profile", "-f", work / "ma.yaml"],
                       3600, cwd=work)
    ma_seconds = time.perf_counter() - started
    (work / "ma.log").write_text((done.stdout or "") + (done.stderr or ""))
    if done.returncode != 0:
        say(f"Model Analyzer failed (exit {done.returncode}): {(done.stdout or '')[-1500:]}{(done.stderr or '')[-1500:]}")
        return 1
    ma_best = best_model_analyzer_row(work / "ma_export", args.max_concurrency)
    say(f"Model Analyzer: {ma_seconds:.0f} s; best {ma_best['config']} {ma_best['throughput']:.0f} infer/s, "
        f"p99 {ma_best['p99_ms']:.1f} ms at concurrency {ma_best['concurrency']}")

    # 2. triton-builder tune under Model Analyzer's best p99
    from builder.serving.embedded import EmbeddedServer
    from builder.tuning.tune import run_tune

    tuned_repo = work / "tuned_repository"
    shutil.copytree(repo, tuned_repo)
    started = time.perf_counter()
    pin_process(server_cpus)
    with EmbeddedServer(tuned_repo, load_models=[name]) as server:
        pin_process(client_cpus)
        tuned = run_tune(name, tuned_repo, server.grpc_url, protocol="grpc", p99_budget_ms=ma_best["p99_ms"],
                         write=True, out_dir=work / "tune", engine="perf_analyzer",
                         max_concurrency=args.max_concurrency,
                         progress=lambda line: say(f"  tune {time.perf_counter() - started:6.1f} s  {line}"))
    tune_seconds = time.perf_counter() - started
    say(f"tune: {tune_seconds:.0f} s; winner {(tuned['winner'] or {}).get('label')}")

    # 3. side by side: three copies of the model on one server, measured in interleaved rounds
    side = work / "side_by_side"
    configs = {"default": repo / name / "config.pbtxt",
               "model_analyzer": work / "ma_models" / ma_best["config"] / "config.pbtxt",
               "tune": tuned_repo / name / "config.pbtxt"}
    same = same_configs(configs)  # a config two tools both chose is served and measured once
    for label, shared in same.items():
        if label != shared:
            say(f"{label}'s config is {shared}'s: measured once, reported for both")
    configs = {label: path for label, path in configs.items() if same[label] == label}
    for label, config_path in configs.items():
        copy = side / f"{name}_{label}"
        shutil.copytree(repo / name, copy, ignore=shutil.ignore_patterns("config.pbtxt"))
        text = re.sub(r'^name:\s*"[^"]*"', f'name: "{name}_{label}"', config_path.read_text(), count=1, flags=re.M)
        (copy / "config.pbtxt").write_text(text)
    # the given levels plus where Model Analyzer's pick and tune's winner scored: each config at its own point too
    levels = {int(c) for c in args.concurrencies.split(",") if c.strip()}
    levels.add(int(ma_best["concurrency"]))
    winner_level = ((tuned["winner"] or {}).get("best_level") or {}).get("concurrency")
    levels = sorted(levels | ({int(winner_level)} if winner_level else set()))
    figures: dict[str, dict[int, list[tuple[float, float]]]] = {label: {c: [] for c in levels} for label in configs}
    pin_process(server_cpus)
    with EmbeddedServer(side, load_models=[f"{name}_{label}" for label in configs]) as server:
        pin_process(client_cpus)
        for round_index in range(args.rounds):
            for concurrency in levels:
                for label in configs:
                    figures[label][concurrency].append(
                        perf_analyzer_level(tool, server.grpc_url, f"{name}_{label}", concurrency, args, work))
                say(f"round {round_index + 1}, c={concurrency}: " + ", ".join(
                    f"{k} {v[concurrency][-1][0]:.0f}/s p99 {v[concurrency][-1][1]:.1f} ms" for k, v in figures.items()))
    figures = {label: figures[shared] for label, shared in same.items()}
    print_table(args, figures, ma_seconds, tune_seconds, in_process, ma_best, same)
    return 0


def same_configs(paths: dict[str, Path]) -> dict[str, str]:
    """Each label -> the first label whose config is the same one (parsed with Triton's schema, the model
    name aside): three copies of one config measured side by side differ by the host's noise alone (seen on
    digits: 6,068-6,404 infer/s and p99 2.1-2.4 ms, one of them then 'over the budget')."""
    from builder.repository.config import config_as_dict

    seen: list[tuple[dict, str]] = []
    same = {}
    for label, path in paths.items():
        config = config_as_dict(path.read_text(), str(path))
        config.pop("name", None)
        first = next((known_label for known, known_label in seen if known == config), None)
        if first is None:
            seen.append((config, label))
        same[label] = first or label
    return same


def pinned_exec(cpus) -> str:
    """A shell prefix that runs the next command on ``cpus`` (this interpreter sets the affinity, then execs)."""
    code = (f"import os, sys; os.sched_setaffinity(0, {{{', '.join(map(str, cpus))}}}); "
            "os.execv(sys.argv[1], sys.argv[1:])")
    return f"'{sys.executable}' -c '{code}'"


def best_model_analyzer_row(export: Path, max_concurrency: int) -> dict:
    """Model Analyzer's best measured config by throughput (its results/metrics-model-inference.csv),
    among the rows at concurrency <= ``max_concurrency``: it profiles the default config past its own
    cap (seen: concurrency 128, p99 214 ms), which is no like-for-like comparison."""
    found = sorted(export.rglob("metrics-model-inference.csv"))
    if not found:
        raise SystemExit(f"no metrics-model-inference.csv under {export}: Model Analyzer wrote no results")
    rows = list(csv.DictReader(found[0].open()))
    rows = [r for r in rows if int(r.get("Concurrency") or 0) <= max_concurrency] or rows
    column = next(c for c in rows[0] if c.startswith("Throughput"))
    p99 = next(c for c in rows[0] if c.startswith("p99 Latency"))
    best = max(rows, key=lambda r: float(r[column]))
    return {"config": best["Model Config Path"], "throughput": float(best[column]), "p99_ms": float(best[p99]),
            "concurrency": best.get("Concurrency")}


def perf_analyzer_level(tool, url: str, model: str, concurrency: int, args, work: Path) -> tuple[float, float]:
    """(inferences/s, p99 ms) of one perf_analyzer run at ``concurrency`` (random input data)."""
    from builder.core.processes import run_command
    from builder.tuning.pa_measure import parse_csv

    report = work / f"{model}.csv"
    for stability_pct in (10, 30):  # a level that does not settle within 10 % is measured once more at 30 %
        report.unlink(missing_ok=True)
        done = run_command(tool.command(["-m", model, "-u", re.sub(r"^[a-z]+://", "", url), "-i", "grpc",
                                         "--concurrency-range", f"{concurrency}:{concurrency}",
                                         "--measurement-mode", "time_windows", "--measurement-interval",
                                         str(args.window_ms), "-s", str(stability_pct), "-f", str(report)]),
                           600, env=tool.environment())
        output = (done.stdout or "") + (done.stderr or "")
        if done.returncode == 0 and report.is_file():
            row = parse_csv(report.read_text())[0]
            return row.inferences_per_s, (row.p99_us or 0) / 1e3
        if "stable measurement" not in output:
            raise SystemExit(f"perf_analyzer failed on {model}: {output[-1600:]}")
    return 0.0, math.inf  # never settled: counts as no throughput within any p99


def print_table(args, figures, ma_seconds, tune_seconds, in_process, ma_best, same=None) -> None:
    """Medians per config and concurrency, then each config's best within Model Analyzer's p99: the larger of
    the p99 its search reported and its pick's median p99 here at the concurrency it chose (a budget set at
    the search's figure alone left Model Analyzer's own pick out when it read 20.8 ms against 20.0)."""
    medians = {label: {c: (statistics.median(t for t, _ in runs), statistics.median(p for _, p in runs))
                       for c, runs in by_level.items()} for label, by_level in figures.items()}
    own = medians["model_analyzer"].get(int(ma_best["concurrency"] or 0))
    budget = max(ma_best["p99_ms"], own[1] if own and math.isfinite(own[1]) else 0.0)
    levels = list(next(iter(medians.values())))
    same = same or {}
    shown = {label: label if same.get(label, label) == label else f"{label} (={same[label]})" for label in medians}
    width = max(16, *map(len, shown.values())) + 1
    print()
    print(f"{args.example}, perf_analyzer, median of {args.rounds} interleaved rounds: infer/s (p99 ms)")
    print(f"{'config':<{width}}|" + "|".join(f"{'c=' + str(c):>16} " for c in levels))
    for label, by_level in medians.items():
        print(f"{shown[label]:<{width}}|" + "|".join(f"{t:>8.0f} ({p:>5.1f}) " for t, p in by_level.values()))
    best = {}
    for label, by_level in medians.items():
        within = [(t, p, c) for c, (t, p) in by_level.items() if round(p, 1) <= round(budget, 1)]  # as printed
        best[label] = max(within) if within else (0.0, None, None)
    print()
    print(f"best median throughput at p99 <= {budget:.1f} ms (Model Analyzer's best p99: its search's "
          f"{ma_best['p99_ms']:.1f} ms or its pick's median here, the larger; tune searched under the first)")
    print(f"{'config':<{width}}| {'infer/s':>8} | {'p99 ms':>7} | {'conc':>4} | {'x default':>9} | {'x in-process':>12} | search s")
    print("-" * width + "+" + "-" * 10 + "+" + "-" * 9 + "+" + "-" * 6 + "+" + "-" * 11 + "+" + "-" * 14 + "+" + "-" * 9)
    default = best["default"][0]
    for label, (throughput, p99, concurrency) in best.items():
        seconds = {"model_analyzer": f"{ma_seconds:.0f}", "tune": f"{tune_seconds:.0f}"}.get(label, "-")
        versus = f"{throughput / in_process:.2f}" if in_process and throughput else "-"
        print(f"{shown[label]:<{width}}| {throughput:>8.0f} | {p99 if p99 is not None else float('nan'):>7.1f} | "
              f"{concurrency or '-':>4} | {throughput / default if default else float('nan'):>9.2f} | "
              f"{versus:>12} | {seconds}")
    ma, ours = best["model_analyzer"], best["tune"]
    print()
    print(json.dumps({"tune_vs_model_analyzer_throughput": round(ours[0] / ma[0], 3) if ma[0] else None,
                      "p99_budget_ms": budget, "tune": ours, "model_analyzer": ma,
                      "tune_vs_model_analyzer_wall_time": round(tune_seconds / ma_seconds, 3),
                      "in_process_best": in_process, "model_analyzer_own_best": ma_best,
                      "same_config": {k: v for k, v in (same or {}).items() if k != v},
                      "medians": {k: {str(c): v for c, v in m.items()} for k, m in medians.items()}}))


if __name__ == "__main__":
    raise SystemExit(main())
