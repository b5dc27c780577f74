"""Load testing, sweeps and tuning against the real embedded tritonserver, with real Locust
subprocesses: counts checked against Triton's own statistics, SLO exit codes, a server killed
mid-run, a Locust that hangs, distributed mode, and `tune --write` end to end."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from builder.core.errors import ServerError
from builder.serving.embedded import EmbeddedServer
from builder.tuning.loadtest import LOADTEST_DIR, format_summary, run_loadtest
from tests.conftest import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "digits_cnn"


def _copy_repository(built_repository: Path, target: Path) -> Path:
    shutil.copytree(built_repository / MODEL, target / MODEL)
    return target


@pytest.fixture(scope="module")
def own_server(built_repository, tmp_path_factory):
    """A server of our own on a copy of the repository: nothing else sends requests to it, and tune
    may rewrite its config."""
    repo = _copy_repository(built_repository, tmp_path_factory.mktemp("loadtest_repo") / "repo")
    server = EmbeddedServer(repo, ready_timeout=90)
    server.start()
    yield server
    server.stop()
    assert not server.is_running()


def _success_count(server: EmbeddedServer) -> int:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{MODEL}/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_headless_load_matches_the_servers_own_count(own_server, tmp_path, protocol):
    url = own_server.http_url if protocol == "http" else own_server.grpc_url
    before = _success_count(own_server)
    summary = run_loadtest(MODEL, url, protocol, users=4, run_time_s=3, out_dir=tmp_path,
                           repository=own_server.repository, timeout_s=60)
    served = _success_count(own_server) - before
    client = summary["client"]
    assert summary["exit_code"] == 0, format_summary(summary)
    assert client["failures"] == 0 and client["requests"] > 100
    assert served == client["requests"], f"server answered {served}, Locust counted {client['requests']}"
    assert summary["server"]["requests"] == served and summary["counts_match"]
    assert summary["payload"].endswith("reference.npz")
    assert summary["server"]["executions"] > 0 and summary["server"]["batch_sizes"]
    assert sum(int(size) * n for size, n in summary["server"]["batch_sizes"].items()) == served
    assert summary["server"]["queue_us_per_request"] >= 0 and summary["server"]["compute_us_per_request"] > 0
    for q in ("p50_ms", "p90_ms", "p95_ms", "p99_ms"):
        assert client[q] is not None
    assert summary["slo"]["met"]
    files = {p.name for p in tmp_path.iterdir()}
    assert {"summary.json", "report.html", "locust_stats.csv", "locust_failures.csv",
            "locust_stats_history.csv"} <= files
    assert json.loads((tmp_path / "summary.json").read_text())["client"]["requests"] == client["requests"]
    assert f"{protocol}, 4 users: {client['requests']} requests, 0 failures" in format_summary(summary)


def test_broken_slo_exits_nonzero_and_says_why(own_server, tmp_path):
    proc = run_cli("loadtest", MODEL, "--url", own_server.http_url, "--users", "2", "--run-time", "2",
                   "--slo-p99-ms", "0.001", "--out", str(tmp_path), "--timeout", "60", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "SLO BROKEN: p99" in proc.stdout and "> --slo-p99-ms 0.001" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not summary["slo"]["met"] and summary["client"]["failures"] == 0


def test_bad_arguments_and_unreachable_server_exit_2(tmp_path):
    unreachable = run_cli("loadtest", MODEL, "--url", "127.0.0.1:9", "--run-time", "2", "--out", str(tmp_path))
    assert unreachable.returncode == 2 and "cannot reach Triton at 127.0.0.1:9" in unreachable.stderr
    bad = run_cli("loadtest", MODEL, "--users", "0", "--out", str(tmp_path))
    assert bad.returncode == 2 and "--users 0" in bad.stderr
    no_budget = run_cli("tune", MODEL, "--repository", str(tmp_path), "--p99-budget-ms", "-1")
    assert no_budget.returncode == 2 and "--p99-budget-ms" in no_budget.stderr


@pytest.mark.parametrize("protocol, workers", [("grpc", 0), ("http", 1)])
def test_a_server_killed_mid_run_stops_the_load_test_with_exit_2(built_repository, tmp_path, protocol, workers):
    repo = _copy_repository(built_repository, tmp_path / "repo")
    with EmbeddedServer(repo) as server:
        url = server.grpc_url if protocol == "grpc" else server.http_url
        killed_at = []

        def kill_once_under_load():
            # after the first requests were served, not after a fixed time: Locust's start-up (and its
            # pre-run check of the server) takes longer on a busy host
            deadline = time.monotonic() + 60
            while _success_count(server) < 20 and time.monotonic() < deadline:
                time.sleep(0.1)
            killed_at.append(time.monotonic())
            os.killpg(server.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_once_under_load)
        killer.start()
        summary = run_loadtest(MODEL, url, protocol, users=4, run_time_s=60, out_dir=tmp_path / "out",
                               timeout_s=120, workers=workers)
        ended_at = time.monotonic()
        killer.join()
    assert ended_at - killed_at[0] < 10, f"the run went on {ended_at - killed_at[0]:.1f} s after the kill"
    assert summary["exit_code"] == 2 and not summary["timed_out"], format_summary(summary)
    unreachable = summary["client"]["unreachable"]
    assert re.match(rf"server at {re.escape(url)} unreachable since \d\d:\d\d:\d\d", unreachable), unreachable
    assert summary["slo"]["broken"][0] == unreachable
    assert summary["client"]["failures"] > 0 and summary["client"]["errors"]
    # backed off, no retry storm: a few failed requests per user and second, not thousands
    assert summary["client"]["failures"] < 4 * 25 * 10, summary["client"]["failures"]
    assert summary["server"]["error"], "statistics of a dead server cannot be read"
    log = (tmp_path / "out" / "locust.log").read_text()
    assert "triton-locust: failure x" in log  # the console summary names the top failure reasons


def test_hard_timeout_kills_a_locust_that_hangs(own_server, tmp_path):
    # a copy of loadtest/ whose locustfile never finishes shutting down and ignores SIGTERM
    hanging = tmp_path / "loadtest"
    shutil.copytree(LOADTEST_DIR, hanging, ignore=shutil.ignore_patterns("__pycache__"))
    with open(hanging / "locustfile.py", "a") as handle:
        handle.write("\n\n@events.quitting.add_listener\ndef _hang(environment, **kwargs):\n"
                     "    import signal as _signal\n    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)\n"
                     "    while True:\n        gevent.sleep(1)\n")
    started = time.monotonic()
    summary = run_loadtest(MODEL, own_server.http_url, "http", users=2, run_time_s=2, out_dir=tmp_path / "out",
                           timeout_s=8, locustfile=hanging / "locustfile.py")
    elapsed = time.monotonic() - started
    assert summary["timed_out"] and summary["exit_code"] == 1
    assert elapsed < 8 + 12, f"took {elapsed:.1f} s"
    assert any("killed" in reason for reason in summary["slo"]["broken"])
    assert summary["client"]["requests"] > 0  # Locust's last CSV rows
    assert own_server.is_ready()


def test_distributed_master_and_two_workers(own_server, tmp_path):
    before = _success_count(own_server)
    summary = run_loadtest(MODEL, own_server.http_url, "http", users=4, run_time_s=4, out_dir=tmp_path,
                           workers=2, repository=own_server.repository, timeout_s=90)
    assert summary["exit_code"] == 0, format_summary(summary)
    assert summary["client"]["failures"] == 0 and summary["client"]["requests"] > 100
    assert _success_count(own_server) - before == summary["client"]["requests"]
    for index in (1, 2):  # each worker ran users and reported to the master
        log = (tmp_path / f"locust-worker-{index}.log").read_text()
        assert "Shutting down" in log, log[-2000:]


def test_sweep_writes_csv_and_png(own_server, tmp_path):
    proc = run_cli("sweep", MODEL, "--url", own_server.grpc_url, "--levels", "1,4", "--window", "0.25",
                   "--seconds-per-level", "2", "--out", str(tmp_path), "--repository", str(own_server.repository),
                   "--engine", "python", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = (tmp_path / "sweep.csv").read_text().splitlines()
    assert rows[0].startswith("concurrency,throughput_rps,p50_ms,p90_ms,p95_ms,p99_ms") and len(rows) == 3
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert "tritonclient.grpc" in result["client"]
    for level in result["levels"]:
        assert level["throughput_rps"] > 0 and level["p99_ms"] > 0 and level["failures"] == 0
        assert level["server_compute_us"] > 0 and level["server_batch_sizes"]
    assert set(result["levels"][0]["server_batch_sizes"]) == {"1"}  # one request in flight: no batching


def _tree_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tune_writes_the_winner_and_the_server_serves_it(own_server, tmp_path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from builder.repository.config import thread_parameter

    repo = own_server.repository
    version_before = _tree_hashes(repo / MODEL / "1")
    built = model_config_pb2.ModelConfig()
    text_format.Parse((repo / MODEL / "config.pbtxt").read_text(), built)
    budget = 50.0
    built_instances = int(re.search(r"count: (\d+)", (repo / MODEL / "config.pbtxt").read_text()).group(1))
    proc = run_cli("tune", MODEL, "--repository", str(repo), "--url", own_server.grpc_url, "--p99-budget-ms",
                   str(budget), "--seconds-per-candidate", "3", "--delays", "0", "--instances", "1,5",
                   "--threads", "2", "--max-batch-sizes", "8", "--levels", "1,4", "--out", str(tmp_path), "--write",
                   timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    labels = ["default", "no batching"] + [f"{n} instances" for n in (1, 5) if n != built_instances]
    for label in labels:  # the table lists every candidate; the config as built is "default"
        assert f"\n{label} " in out, out
    assert " x 2 threads " in out, out  # intra-op threads tried with the best instance count
    assert "\nmax batch 8 " in out, out
    assert "WINNER" in out and "x no batching" in out and "x default" in out

    record = json.loads((tmp_path / "tuning.json").read_text())
    winner = record["winner"]
    assert winner["best_level"]["p99_ms"] <= budget and winner["throughput_within_budget_rps"] > 0
    assert len(record["candidates"]) == len(labels) + 2  # + threads, max batch
    assert set(record["ratios"]) == {"vs_no_batching", "vs_default"}
    if winner["label"] == "default":  # measured best: the file already serves it, nothing is rewritten
        assert not record["written"] and "the config as built won: nothing written" in out, out
        assert not (repo / MODEL / "tuning.json").exists() and "Tuned by" not in (repo / MODEL / "config.pbtxt").read_text()
        return
    assert record["written"]
    assert record == json.loads((repo / MODEL / "tuning.json").read_text())

    text = (repo / MODEL / "config.pbtxt").read_text()
    assert text.startswith("# Rendered by triton-builder") and "# Tuned by triton-builder tune" in text
    assert "tuning.json" in text
    config = model_config_pb2.ModelConfig()
    text_format.Parse(text, config)  # Triton's own schema
    # the standard folder stays standard: tune changes sizing and batching, never what runs the model
    assert (config.name, config.backend, config.platform) == (MODEL, built.backend, built.platform)
    threads_key = thread_parameter(config.parameters)
    assert threads_key and threads_key == thread_parameter(built.parameters)
    assert config.instance_group[0].count == winner["instances"]
    assert config.HasField("dynamic_batching") == winner["dynamic_batching"]
    assert _tree_hashes(repo / MODEL / "1") == version_before, "the version folder must not change"
    assert not [p.name for p in repo.iterdir() if p.name.endswith(".tmp")]

    with urllib.request.urlopen(f"http://{own_server.http_url}/v2/models/{MODEL}/config", timeout=10) as response:
        served = json.load(response)
    assert served["instance_group"][0]["count"] == winner["instances"]
    assert ("dynamic_batching" in served) == winner["dynamic_batching"]
    assert served["max_batch_size"] == winner["max_batch_size"]
    threads = str(winner["intra_op_threads"] or built.parameters[threads_key].string_value)  # none tried: as built
    assert served["parameters"][threads_key]["string_value"] == threads
    assert own_server.model_ready(MODEL)


def test_tune_loads_candidates_as_copies_while_the_model_stays_ready(own_server, tmp_path):
    from builder.serving.client import TritonClient
    from builder.tuning.tune import run_tune

    ready, stop = [], threading.Event()

    def watch():
        with TritonClient(own_server.http_url, "http") as client:
            while not stop.is_set():
                ready.append(client.model_ready(MODEL))
                time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        record = run_tune(MODEL, own_server.repository, own_server.grpc_url, p99_budget_ms=200,
                          seconds_per_candidate=2.0, delays=[100], instance_counts=[1, 3], max_batch_sizes=[8],
                          levels=[1, 2], confirm=False, out_dir=tmp_path)
    finally:
        stop.set()
        watcher.join()
    assert record["candidates_loaded_as"].startswith("copies of the model"), record["candidates_loaded_as"]
    assert len(ready) > 20 and all(ready), f"{ready.count(False)} of {len(ready)} polls found the model not ready"
    measured = [c for c in record["candidates"] if not c["error"]]
    # how many candidates the staged search tries follows its measurements (a delay that serves less stops
    # the delays; a size equal to the best's is skipped; the baselines may coincide): the default and at
    # least one copy, every one measured
    assert len(measured) == len(record["candidates"]) >= 2, [(c["label"], c["error"]) for c in record["candidates"]]
    assert any(c["label"] != "default" for c in measured), [c["label"] for c in measured]
    for candidate in measured:  # Triton's statistics were read from the copy each was measured on
        assert candidate["best_level"]["server_avg_batch"] >= 1, candidate
    deadline = time.monotonic() + 20  # the last copy unloads in the background (~1 s per instance)
    with TritonClient(own_server.http_url, "http") as client:
        while (copies := [m["name"] for m in client.statistics()["model_stats"] if "__tune" in m["name"]]):
            assert time.monotonic() < deadline, f"copies still loaded: {copies}"
            time.sleep(0.2)


@pytest.mark.parametrize("outcome", ["a change wins", "the config as built wins"])
def test_tune_publish_serves_a_winning_change_as_a_new_version_and_nothing_when_the_build_wins(
        built_repository, tmp_path, monkeypatch, outcome):
    from builder.tuning import tune

    def pick(candidates, default, margin):  # the measurements decide in real runs: both outcomes, injected
        if outcome == "the config as built wins":
            return default
        return next(c for c in candidates if c is not default and c.best is not None and not c.error)

    monkeypatch.setattr(tune, "_choose", pick)
    repo = _copy_repository(built_repository, tmp_path / "repo")
    said = []
    with EmbeddedServer(repo, load_models=[MODEL], ready_timeout=90) as server:
        record = tune.run_tune(MODEL, repo, server.grpc_url, p99_budget_ms=200, seconds_per_candidate=2,
                               delays=[0], instance_counts=[1], thread_counts=[2], max_batch_sizes=[64], levels=[1],
                               confirm=False, out_dir=tmp_path / "tune", publish=True, progress=said.append)
        if outcome == "the config as built wins":
            assert record["winner"]["label"] == "default" and not record["written"]
            assert "published_version" not in record and not (repo / MODEL / "2").exists()
            assert "the config as built won: nothing published" in said[-1]
            return
        assert record["winner"]["label"] != "default" and record["published_version"] == 2
        assert (repo / MODEL / "2" / "tuning.json").is_file()
        assert server.model_ready(MODEL)
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{MODEL}/versions/2/ready", timeout=10):
            pass  # 200: the new version is served


def test_tune_write_rewrites_the_config_in_place_with_an_injected_winner(built_repository, tmp_path, monkeypatch):
    """The --write branch every run (the CLI test above reaches it only when a change measures best)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from builder.repository.config import thread_parameter
    from builder.tuning import tune

    monkeypatch.setattr(tune, "_choose", lambda candidates, default, margin: next(
        c for c in candidates if c is not default and c.best is not None and not c.error and c.threads))
    repo = _copy_repository(built_repository, tmp_path / "repo")
    built = model_config_pb2.ModelConfig()
    text_format.Parse((repo / MODEL / "config.pbtxt").read_text(), built)
    version_before = _tree_hashes(repo / MODEL / "1")
    with EmbeddedServer(repo, load_models=[MODEL], ready_timeout=90) as server:
        record = tune.run_tune(MODEL, repo, server.grpc_url, p99_budget_ms=200, seconds_per_candidate=2,
                               delays=[0], instance_counts=[1], thread_counts=[2], max_batch_sizes=[8], levels=[1],
                               confirm=False, out_dir=tmp_path / "tune", write=True)
        winner = record["winner"]
        assert winner["label"] != "default" and winner["intra_op_threads"] == 2 and record["written"]
        written = model_config_pb2.ModelConfig()
        text = (repo / MODEL / "config.pbtxt").read_text()
        text_format.Parse(text, written)  # Triton's own schema
        assert "# Tuned by triton-builder tune" in text
        assert (written.backend, written.platform) == (built.backend, built.platform)  # still the standard folder
        key = thread_parameter(written.parameters)
        assert key == thread_parameter(built.parameters) and written.parameters[key].string_value == "2"
        assert _tree_hashes(repo / MODEL / "1") == version_before, "the version folder must not change"
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{MODEL}/config", timeout=10) as response:
            served = json.load(response)
        assert served["parameters"][key]["string_value"] == "2"
        assert served["instance_group"][0]["count"] == winner["instances"] and server.model_ready(MODEL)


def test_tune_refuses_a_budget_nothing_meets(own_server, tmp_path):
    # the config as it is now: an earlier test's tune --write may have made a smaller max batch the winner
    built_max = re.search(r"max_batch_size: (\d+)", (own_server.repository / MODEL / "config.pbtxt").read_text()).group(1)
    proc = run_cli("tune", MODEL, "--repository", str(own_server.repository), "--url", own_server.grpc_url,
                   "--p99-budget-ms", "0.001", "--seconds-per-candidate", "2", "--delays", "0", "--instances", "1",
                   "--max-batch-sizes", built_max, "--levels", "1", "--no-confirm", "--in-place", "--out",
                   str(tmp_path), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no candidate met p99 <= 0.001 ms" in proc.stdout
    assert json.loads((tmp_path / "tuning.json").read_text())["candidates_loaded_as"] == "the model itself, reloaded"
    assert own_server.model_ready(MODEL)  # the model was reloaded from its (unchanged) file


def test_unreachable_model_is_a_server_error(own_server, tmp_path):
    with pytest.raises(ServerError, match="model 'nope' is not ready"):
        run_loadtest("nope", own_server.http_url, "http", users=1, run_time_s=1, out_dir=tmp_path)


@pytest.mark.parametrize("shape, counts", [("ramp", [1, 2, 3, 4]), ("steps", [1, 2, 3, 4])])
def test_load_shapes_raise_users_over_the_run(own_server, tmp_path, shape, counts):
    summary = run_loadtest(MODEL, own_server.http_url, "http", users=4, run_time_s=4, out_dir=tmp_path,
                           shape=shape, timeout_s=60)
    assert summary["exit_code"] == 0, format_summary(summary)
    log = (tmp_path / "locust.log").read_text()
    seen = [int(n) for n in re.findall(r"Shape test updating to (\d+) users", log)]
    assert seen == counts, log[-3000:]


# ------------------------------------------------------------------------------------------------
# the pieces without a server (fast)


def test_statistics_deltas_from_either_client():
    from builder.tuning.stats import parse_stats, server_view

    def answer(success, executions, sizes, as_strings):
        cast = str if as_strings else int
        return {"model_stats": [{"name": MODEL, "version": "1", "inference_count": cast(success),
                                 "execution_count": cast(executions),
                                 "inference_stats": {"success": {"count": cast(success), "ns": cast(success * 3000)},
                                                     "fail": {}, "queue": {"count": cast(success), "ns": cast(success * 1000)},
                                                     "compute_infer": {"count": cast(success), "ns": cast(success * 2000)}},
                                 "batch_stats": [{"batch_size": cast(b), "compute_infer": {"count": cast(n), "ns": "0"}}
                                                 for b, n in sizes.items()]}]}

    before = parse_stats(answer(10, 10, {1: 10}, as_strings=True), MODEL)  # gRPC JSON: int64 as strings
    after = parse_stats(answer(40, 15, {1: 10, 4: 5}, as_strings=False), MODEL)
    view = server_view(before, after)
    assert view["requests"] == 30 and view["executions"] == 5 and view["batch_sizes"] == {"4": 5}
    assert view["average_batch_size"] == 6.0 and view["queue_us_per_request"] == 1.0
    assert view["compute_us_per_request"] == 2.0 and view["queue_share"] == round(1 / 3, 3)
    assert server_view(after, before)["error"]  # a reload in between restarts the counters


def test_tuned_config_is_validated_before_anything_is_written(built_repository, tmp_path):
    from builder.core.errors import BuilderError
    from builder.repository.config import config_as_dict
    from builder.repository.tuned import config_text_from_dict, write_tuned_config

    repo = _copy_repository(built_repository, tmp_path / "repo")
    config_file = repo / MODEL / "config.pbtxt"
    original = config_file.read_text()
    config = config_as_dict(original)
    config["input"][0]["dims"] = ["1", "9", "9"]
    with pytest.raises(BuilderError, match="changes 'input'"):
        write_tuned_config(repo, MODEL, config_text_from_dict(config), {"x": 1})
    assert config_file.read_text() == original and not (repo / MODEL / "tuning.json").exists()
    config = config_as_dict(original)
    config["instance_group"][0]["count"] = 2
    text = config_text_from_dict(config, ["# tuned"])
    assert text.startswith('# tuned\nname: "digits_cnn"\nplatform: "onnxruntime_onnx"\n'
                           'default_model_filename: "model.onnx"\nmax_batch_size: 64\n')
    write_tuned_config(repo, MODEL, text, {"winner": "2 instances"})
    assert config_as_dict(config_file.read_text())["instance_group"][0]["count"] == 2
    assert json.loads((repo / MODEL / "tuning.json").read_text()) == {"winner": "2 instances"}
    assert sorted(p.name for p in (repo / MODEL).iterdir()) == ["1", "config.pbtxt", "tuning.json", "warmup"]


def test_payload_layouts(built_repository, tmp_path):
    import numpy as np

    from builder.core.errors import UserInputError
    from builder.tuning.payload import make_requests, read_npz_samples

    reference = read_npz_samples(built_repository / MODEL / "1" / "reference.npz", ["image"], batching=True)
    assert reference and all(s["image"].shape == (1, 1, 8, 8) for s in reference)
    plain = tmp_path / "val.npz"
    np.savez(plain, image=np.zeros((5, 1, 8, 8), np.float32), labels=np.arange(5))
    assert len(read_npz_samples(plain, ["image"], batching=True)) == 5
    assert make_requests(read_npz_samples(plain, ["image"], True), 4)[0]["image"].shape == (4, 1, 8, 8)
    with pytest.raises(UserInputError, match=r"no array for input\(s\) tokens .*has: image, labels"):
        read_npz_samples(plain, ["tokens"], batching=True)


@pytest.mark.parametrize("in_place", [False, True], ids=["copies", "in_place"])
def test_tune_killed_with_sigterm_puts_the_server_back(own_server, tmp_path, in_place):
    """`kill` (SIGTERM) mid-search: like Ctrl-C, the candidate copy is unloaded (copies) or the model
    reloaded from its config.pbtxt (--in-place); it used to exit 143 leaving a copy or no model."""
    import subprocess
    import sys

    from builder.serving.client import TritonClient

    config_before = (own_server.repository / MODEL / "config.pbtxt").read_text()
    proc = subprocess.Popen([sys.executable, "-m", "builder", "tune", MODEL, "--repository", str(own_server.repository),
                             "--url", own_server.grpc_url, "--p99-budget-ms", "200", "--seconds-per-candidate", "4",
                             "--levels", "1", "--out", str(tmp_path)] + (["--in-place"] if in_place else []),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    copies = [f"{MODEL}__tune{proc.pid}_{n}" for n in range(1, 12)]

    def candidate_in_place(client, built) -> bool:
        """The model is unloaded, or serves another config than the built one (Triton's own C++ backend
        reloads in milliseconds: a poll can miss the unloaded moment, not the candidate's config)."""
        try:
            return not client.model_ready(MODEL) or client.model_config(MODEL) != built
        except Exception:  # noqa: BLE001 - between the unload and the load
            return True

    with TritonClient(own_server.http_url, "http") as client:
        built = client.model_config(MODEL)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:  # until a candidate is being served
            if candidate_in_place(client, built) if in_place else client.model_ready(copies[0]):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "tune ended before a candidate was loaded"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a copy's unload is asynchronous
            left = [name for name in copies if client.model_ready(name)]
            if client.model_ready(MODEL) and not left:
                break
            time.sleep(0.2)
        assert client.model_ready(MODEL), out
        assert not left, (left, out)
    assert proc.returncode == 130 and "interrupted" in out, out
    assert (own_server.repository / MODEL / "config.pbtxt").read_text() == config_before
