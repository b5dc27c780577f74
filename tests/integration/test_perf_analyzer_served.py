"""The REAL perf_analyzer (2.51, installed by builder/tuning/perf_analyzer.py, as `make setup` does) as the
measurement engine of sweep and tune against the real embedded tritonserver: digits over gRPC and HTTP,
bert_tiny's dynamic sequence length, a tune, and a perf_analyzer run that fails."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from builder.tuning.perf_analyzer import PerfAnalyzerMissing, install_perf_analyzer
from builder.tuning.stats import StatsReader
from tests.conftest import in_ci

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def perf_analyzer():
    try:
        return install_perf_analyzer()  # the cached one; downloads it (14 MB, once) where setup did not
    except PerfAnalyzerMissing as exc:
        if in_ci():
            pytest.fail(f"{exc} -- CI is set, and make setup installs perf_analyzer")
        pytest.skip(str(exc))


def test_sweep_measures_digits_with_perf_analyzer(served, perf_analyzer, tmp_path):
    from builder.tuning.sweep import run_sweep

    url, protocol = served.grpc_url, "grpc"
    reader = StatsReader(url, protocol)
    before = reader.snapshot("digits_cnn").success
    result = run_sweep("digits_cnn", url, protocol, levels=[1, 4], out_dir=tmp_path, window_s=0.25,
                       max_seconds_per_level=2.0, repository=served.repository, engine="perf_analyzer")
    served_requests = reader.snapshot("digits_cnn").success - before
    reader.close()
    assert result["engine"] == "perf_analyzer"
    assert result["client"].startswith(f"perf_analyzer 2.51.0 (Triton's C++ load generator, closed loop over {protocol}")
    one, four = result["levels"]
    for level in (one, four):
        assert level["failures"] == 0 and level["throughput_rps"] > 0 and level["requests"] > 0
        assert 0 < level["p50_ms"] <= level["p90_ms"] <= level["p95_ms"] <= level["p99_ms"]
        assert level["server_compute_us"] > 0 and level["server_queue_us"] >= 0
    assert set(one["server_batch_sizes"]) == {"1"}  # one request in flight: Triton never batched
    # perf_analyzer's requests (measured windows) were all served; the server also saw its settling windows
    assert one["requests"] + four["requests"] <= served_requests
    data = json.loads((tmp_path / "perf_analyzer" / "digits_cnn_input_data.json").read_text())
    reference = np.load(served.repository / "digits_cnn" / "1" / "reference.npz")
    rows = sum(len(reference[key]) for key in reference.files if key.startswith("input/"))
    assert len(data["data"]) == min(rows, 256) and data["data"][0]["image"]["shape"] == [1, 8, 8]  # every row
    assert (tmp_path / "perf_analyzer" / "digits_cnn_c4.csv").read_text().startswith("Concurrency,Inferences/Second")
    assert (tmp_path / "sweep.csv").read_text().startswith("concurrency,throughput_rps,p50_ms,p90_ms,p95_ms,p99_ms")


def test_sweep_over_http(served, perf_analyzer, tmp_path):
    from builder.tuning.sweep import run_sweep

    result = run_sweep("digits_cnn", served.http_url, "http", levels=[2], out_dir=tmp_path, window_s=0.25,
                       max_seconds_per_level=1.5, repository=served.repository, engine="auto")
    assert result["engine"] == "perf_analyzer" and "closed loop over http" in result["client"]
    [level] = result["levels"]
    assert level["failures"] == 0 and level["throughput_rps"] > 0 and level["p99_ms"] > 0, level["errors"]


def test_dynamic_sequence_lengths_and_batches_of_two(served, perf_analyzer, tmp_path):
    from builder.tuning.sweep import run_sweep

    result = run_sweep("bert_tiny", served.grpc_url, "grpc", levels=[2], out_dir=tmp_path, window_s=0.25,
                       max_seconds_per_level=2.0, repository=served.repository, engine="perf_analyzer", batch_size=2)
    [level] = result["levels"]
    assert level["failures"] == 0 and level["throughput_rps"] > 0, level["errors"]
    assert set(level["server_batch_sizes"]) <= {"2", "4"}  # requests of 2 rows, batched in pairs at most
    data = json.loads((tmp_path / "perf_analyzer" / "bert_tiny_input_data.json").read_text())
    assert {len(step["input_ids"]["shape"]) for step in data["data"]} == {1}
    assert len({step["input_ids"]["shape"][0] for step in data["data"]}) == 1  # one length: batchable


def test_tune_measures_with_perf_analyzer(served, perf_analyzer, tmp_path):
    from builder.tuning.tune import run_tune

    said = []
    record = run_tune("digits_cnn", served.repository, served.grpc_url, p99_budget_ms=200, seconds_per_candidate=1.0,
                      window_s=0.25, delays=[0], instance_counts=[], thread_counts=[], max_batch_sizes=[], levels=[1],
                      confirm=False,
                      out_dir=tmp_path, engine="perf_analyzer", progress=said.append)
    assert record["engine"] == "perf_analyzer" and record["client"].startswith("perf_analyzer 2.51.0")
    assert record["exit_code"] == 0 and record["winner"]["throughput_within_budget_rps"] > 0
    assert [c["label"] for c in record["candidates"]] == ["default", "no batching"]
    assert served.model_ready("digits_cnn")


def test_a_failing_perf_analyzer_run_is_a_failed_level(served, perf_analyzer, tmp_path):
    from builder.tuning.pa_measure import measure_with_perf_analyzer

    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"wrong_name": {"content": [1.0], "shape": [1]}}]}))
    level = measure_with_perf_analyzer(perf_analyzer, served.grpc_url, "grpc", "digits_cnn", 1, data,
                                       work_dir=tmp_path, window_s=0.25, max_s=1.0)
    assert level.failures == 1 and level.throughput == 0 and not level.stable
    assert level.errors[0].startswith("perf_analyzer exit ") and "image" in level.errors[0], level.errors


def test_the_main_job_reports_perf_analyzers_figure(served, perf_analyzer, tmp_path):
    from builder.main_job import _perf_analyzer

    said = []
    repo = tmp_path / "model_repository"
    shutil.copytree(served.repository / "digits_cnn", repo / "digits_cnn")
    line, rps = _perf_analyzer("digits_cnn", served, 2, repo, said.append)
    assert " req/s at concurrency 2 over gRPC, p50 " in line and rps > 0, said
    assert said == [f"  perf_analyzer 2.51.0: {line}"]
    assert (tmp_path / "model_repository-run" / "perf_analyzer" / "digits_cnn" / "digits_cnn_input_data.json").is_file()


def test_the_main_jobs_load_row_is_client_side_with_its_ratio_to_perf_analyzer():
    from builder.main_job import _format_load

    summary = {"requests": 900, "failures": 0, "rps": 300.0, "p50_ms": 20.0, "p99_ms": 41.5,
               "slo": {"met": True, "broken": []}, "server": {"average_batch_size": 3.5}}
    assert _format_load(summary, 500.0) == ("900 requests, 0 failures, SLO met, client-side 300 req/s = 0.60 x "
                                            "perf_analyzer's, p50 20.0 ms, p99 41.5 ms, avg formed batch 3.50")
    broken = dict(summary, slo={"met": False, "broken": ["p99 41.5 ms > 10 ms"]}, server={})
    assert _format_load(broken) == ("900 requests, 0 failures, SLO BROKEN (p99 41.5 ms > 10 ms), client-side "
                                    "300 req/s, p50 20.0 ms, p99 41.5 ms")
