"""A long soak of the embedded tritonserver (issue 36): mixed load on two models - digits_cnn monitored
(deploy.monitor: drift publishing on, its python monitor step) over gRPC and bert_tiny over HTTP - for --minutes
(default 60), with a rollout (a new version of digits_cnn published, picked up in poll mode) every
--rollout-every minutes, a drift phase (digits inputs rescaled x*0.3+0.5, as tests/integration/test_monitoring.py
does), and one SIGKILL of the server in the middle followed by a restart on the same ports. Prometheus (Debian's,
the project's rules and alerts) and the exporter scrape it throughout.

Prints: failed requests outside the kill window (and inside it), p99 inside vs outside a rollout, the RSS and
open-file-descriptor growth of the server and of its python stubs after warm-up (per server lifetime: the kill
starts a new one), the number of Prometheus series, and which alerts fired against those expected
(TritonTargetDown and TritonUnreachableFromExporter during the kill, ModelDriftPSIOverThreshold and
ModelDriftJSOverThreshold during the drift phase) and any other that was active, with when. Requests sent up to
2 s before the kill (in flight when it came) count in the kill window.

Usage: python benchmarks/soak.py [--minutes 60] [--rollout-every 10] [--down-seconds 45] [--drift-seconds 120]
                                 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from builder.tuning.steady import SteadyLoad, Switch, summarise  # noqa: E402

DIGITS, BERT = "digits_cnn", "bert_tiny"
EXPECTED = {"TritonTargetDown": "the kill", "TritonUnreachableFromExporter": "the kill",
            "ModelDriftPSIOverThreshold": "the drift phase", "ModelDriftJSOverThreshold": "the drift phase"}
IN_FLIGHT_S = 2.0  # requests sent this long before the kill were in flight when it came: in the kill window


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (the python backend's stubs of a tritonserver)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def usage(pid: int) -> tuple[int, int]:
    """(RSS bytes, open fds) of ``pid``; (0, 0) once it is gone."""
    try:
        rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0, 0


class Sampler(threading.Thread):
    """Every ``period`` s: the server's and its stubs' RSS and fds, tagged with the server's lifetime."""

    def __init__(self, period: float = 5.0):
        super().__init__(daemon=True)
        self.period, self.pid, self.life = period, None, 0
        self.samples: list[dict] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.wait(self.period):
            pid = self.pid
            if pid is None:
                continue
            server = usage(pid)
            stubs = [usage(c) for c in children(pid)]
            if server[0]:
                self.samples.append({"t": time.time(), "life": self.life, "server_rss": server[0], "server_fds": server[1],
                                     "stubs": len(stubs), "stub_rss": sum(s[0] for s in stubs),
                                     "stub_fds": sum(s[1] for s in stubs)})


def growth(samples: list[dict], warmup_s: float) -> list[str]:
    lines = []
    for life in sorted({s["life"] for s in samples}):
        mine = [s for s in samples if s["life"] == life]
        after = [s for s in mine if s["t"] - mine[0]["t"] >= warmup_s] or mine[-1:]
        first, last = after[0], after[-1]
        minutes = (last["t"] - first["t"]) / 60

        def pct(key):
            return f"{(last[key] - first[key]) / first[key] * 100:+.1f} %" if first[key] else "n/a"
        lines.append(f"server lifetime {life + 1} ({minutes:.1f} min after warm-up): server RSS {first['server_rss'] / 2**20:.0f}"
                     f" -> {last['server_rss'] / 2**20:.0f} MiB ({pct('server_rss')}), fds {first['server_fds']} -> "
                     f"{last['server_fds']}; stubs {first['stubs']} -> {last['stubs']}, their RSS "
                     f"{first['stub_rss'] / 2**20:.0f} -> {last['stub_rss'] / 2**20:.0f} MiB ({pct('stub_rss')}), fds "
                     f"{first['stub_fds']} -> {last['stub_fds']}")
    return lines


def build_repository(repo: Path) -> None:
    from builder.pipeline import build
    from builder.spec.model import load_spec

    spec = load_spec(ROOT / "examples" / "digits" / "spec.yaml")
    spec.deploy.monitor = True  # the ensemble over digits_cnn__model and the monitor step: drift published
    build(spec, repo, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
    build(ROOT / "examples" / "bert_tiny" / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0,
          progress=lambda m: None)


def rollout(repo: Path) -> str:
    """A new version of digits_cnn's model step (its files and config again, as `tune --publish` writes them)."""
    from builder.repository.republish import publish_tuned

    step = DIGITS + "__model"
    return str(publish_tuned(repo, step, (repo / step / "config.pbtxt").read_text(), {"benchmark": "soak"})["version"])


class Stack:
    """The embedded server (poll mode, fixed ports so that clients and Prometheus find a restarted one)."""

    def __init__(self, repo: Path, sampler: Sampler):
        from builder.core.ports import free_ports

        self.repo, self.sampler = repo, sampler
        self.ports = free_ports("127.0.0.1", 3)
        self.server = None

    def start(self) -> None:
        from builder.serving.embedded import EmbeddedServer

        http, grpc, metrics = self.ports
        self.server = EmbeddedServer(self.repo, model_control="poll", http_port=http, grpc_port=grpc,
                                     metrics_port=metrics, ready_timeout=180,
                                     extra_args=["--repository-poll-secs=2", "--metrics-config=summary_latencies=true"])
        self.server.start()
        self.sampler.pid = self.server.pid

    def kill(self) -> None:
        self.sampler.pid = None
        os.kill(self.server.pid, signal.SIGKILL)
        try:
            self.server.stop(timeout=10)
        except Exception:  # noqa: BLE001 - it is dead: stop() cleans up what it can
            pass
        self.sampler.life += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--rollout-every", type=float, default=10.0, help="minutes between rollouts")
    ap.add_argument("--down-seconds", type=float, default=45.0, help="how long the killed server stays down")
    ap.add_argument("--drift-seconds", type=float, default=120.0, help="the drift phase (at 10 %% of the run)")
    ap.add_argument("--warmup-seconds", type=float, default=30.0, help="left out of the RSS/fd growth")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_BUILDER_CONTROL_KEY", secrets.token_urlsafe(24))  # one key across the restart

    from builder.core.host import host_profile
    from builder.monitoring.local_exporter import LocalExporter
    from builder.monitoring.prometheus import LocalPrometheus

    host = host_profile(with_gpu=False)
    print(f"host: {host['cpu_model']}; ISA flags: {', '.join(host['isa_flags'])}; usable cores {host.get('usable_cores')}")
    work = Path(tempfile.mkdtemp(prefix="soak-bench-"))
    repo = work / "model_repository"
    build_repository(repo)
    val = np.load(ROOT / "examples" / "digits" / "data" / "val.npz")["image"].astype(np.float32)
    calm = [{"image": val[i:i + 1]} for i in range(64)]
    drifted = [{"image": (val[i:i + 1] * 0.3 + 0.5).astype(np.float32)} for i in range(64)]
    bert = np.load(ROOT / "examples" / "bert_tiny" / "data" / "val.npz")
    texts = [{"input_ids": bert["input_ids"][i:i + 1].astype(np.int64),
              "attention_mask": bert["attention_mask"][i:i + 1].astype(np.int64)} for i in range(16)]
    sampler = Sampler()
    stack = Stack(repo, sampler)
    total_s = args.minutes * 60
    drift_at = total_s * 0.1
    kill_at = max(total_s / 2, drift_at + args.drift_seconds + 5)  # after the drift phase: a restart resets it
    alerts_seen: dict[str, dict] = {}
    switches: list[Switch] = []
    kill_window = None
    exporter = prometheus = None
    try:
        stack.start()
        sampler.start()
        exporter = LocalExporter(stack.server.http_url).start()
        prometheus = LocalPrometheus({"triton": stack.server.metrics_url, "triton-builder-exporter": exporter.address},
                                     scrape_interval="2s", evaluation_interval="2s").start()
        http, grpc = stack.server.http_url, stack.server.grpc_url
        loads = {"calm": SteadyLoad(grpc, "grpc", DIGITS, calm, concurrency=3, pause_s=0.002),
                 "bert": SteadyLoad(http, "http", BERT, texts, concurrency=2, pause_s=0.002)}
        drift_load = None
        for load in loads.values():
            load.__enter__()
        began = time.time()
        next_rollout = args.rollout_every * 60
        killed = False
        print(f"soak: {args.minutes:g} min; rollouts every {args.rollout_every:g} min; drift at {drift_at:.0f} s for "
              f"{args.drift_seconds:g} s; kill at {kill_at:.0f} s for {args.down_seconds:g} s", flush=True)
        while (elapsed := time.time() - began) < total_s:
            if drift_load is None and drift_at <= elapsed < drift_at + args.drift_seconds:
                drift_load = SteadyLoad(grpc, "grpc", DIGITS, drifted, concurrency=1, pause_s=0.002).__enter__()
                print(f"  {elapsed:6.0f} s: drift phase starts", flush=True)
            if drift_load is not None and elapsed >= drift_at + args.drift_seconds and "drift" not in loads:
                drift_load.stop()
                loads["drift"] = drift_load
                print(f"  {elapsed:6.0f} s: drift phase ends", flush=True)
            if not killed and elapsed >= kill_at:
                killed = True
                t0 = time.time()
                stack.kill()
                print(f"  {elapsed:6.0f} s: tritonserver killed (SIGKILL)", flush=True)
                time.sleep(args.down_seconds)
                _poll_alerts(prometheus, alerts_seen, time.time() - began)
                stack.start()
                kill_window = (t0 - IN_FLIGHT_S, time.time() + 5.0)  # 5 s for clients to reconnect after ready
                print(f"  {time.time() - began:6.0f} s: restarted and ready", flush=True)
            if elapsed >= next_rollout:
                t0 = time.time()
                target = rollout(repo)
                ended = _wait_served(stack, target, timeout=60)
                switches.append(Switch("rollout", t0, ended, target))
                print(f"  {t0 - began:6.0f} s: rollout -> {DIGITS}__model version {target}"
                      + (f", loaded after {ended - t0:.1f} s" if ended else ", NOT loaded in 60 s"), flush=True)
                next_rollout += args.rollout_every * 60
            _poll_alerts(prometheus, alerts_seen, elapsed)
            time.sleep(2)
        for load in loads.values():
            load.stop()
        if drift_load is not None and "drift" not in loads:
            drift_load.stop()
            loads["drift"] = drift_load
        series = prometheus.query('count({__name__=~".+"})')
        series_count = int(float(series[0]["value"][1])) if series else None
        exclude = [kill_window] if kill_window else []
        records = sorted((r for load in loads.values() for r in load.records), key=lambda r: r.start)
        summary = summarise(records, switches, exclude=exclude)
        in_kill = [r for r in records if kill_window and kill_window[0] <= r.start <= kill_window[1]]
        print()
        print(f"== soak: {args.minutes:g} min, {len(switches)} rollouts, 1 kill + restart ==")
        print(f"failed requests outside the kill window: {summary.failed} of {summary.requests} "
              f"(during a rollout {summary.failed_in_switch}); inside the kill window: "
              f"{sum(1 for r in in_kill if r.error)} of {len(in_kill)}")
        print("\n".join(summary.lines(timeline=False)[1:]))
        print("\n".join(growth(sampler.samples, args.warmup_seconds)))
        print(f"Prometheus series: {series_count}")
        fired = {name: info for name, info in alerts_seen.items() if info["state"] == "firing"}
        for name, why in EXPECTED.items():
            info = alerts_seen.get(name)
            expected = not name.startswith("ModelDrift") or args.drift_seconds >= 75
            state = (f"{info['state']} at {info['at']:.0f} s" if info else "never active")
            print(f"alert {name} ({why}){'' if expected else ' [not expected: drift phase < 75 s]'}: {state}")
        unexpected = sorted(set(alerts_seen) - set(EXPECTED))
        others = ", ".join(f"{n} ({alerts_seen[n]['state']} at {alerts_seen[n]['at']:.0f} s)" for n in unexpected) or "none"
        print(f"other alerts active at some point: {others}")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "host": host, "minutes": args.minutes, "failed_outside_kill": summary.failed,
                "requests": summary.requests, "series": series_count, "alerts": alerts_seen,
                "samples": sampler.samples, "switches": summary.switches}, indent=1, default=str))
        ok = summary.failed == 0 and all(n in fired for n in EXPECTED
                                         if not n.startswith("ModelDrift") or args.drift_seconds >= 75)
        return 0 if ok else 1
    finally:
        sampler.stop_flag.set()
        for process in (prometheus, exporter, stack.server):
            if process is not None:
                try:
                    process.stop()
                except Exception:  # noqa: BLE001
                    pass
        shutil.rmtree(work, ignore_errors=True)


def _wait_served(stack: Stack, version: str, timeout: float) -> float | None:
    """When the new version of the model step is ready on the server (poll mode loads it by itself)."""
    deadline = time.time() + timeout
    with stack.server.triton() as client:
        while time.time() < deadline:
            try:
                if client.model_ready(DIGITS + "__model", version):
                    return time.time()
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.2)
    return None


def _poll_alerts(prometheus, seen: dict, elapsed: float) -> None:
    try:
        active = prometheus.alerts()
    except Exception:  # noqa: BLE001
        return
    for alert in active:
        name = alert["labels"]["alertname"]
        known = seen.get(name)
        if known is None or (known["state"] == "pending" and alert["state"] == "firing"):
            seen[name] = {"state": alert["state"], "at": elapsed, "labels": alert["labels"]}


if __name__ == "__main__":
    sys.exit(main())
