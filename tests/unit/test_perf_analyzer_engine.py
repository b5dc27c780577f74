"""perf_analyzer as the measurement engine, the parts that need no server: the --input-data JSON it reads
(golden), its CSV report (golden, as perf_analyzer 2.51 writes it), its command line, and what happens
when the binary is missing (an injected path; an install that cannot reach a package index)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.tuning.engine import PerfAnalyzerEngine, PythonEngine, choose_engine
from builder.tuning.pa_measure import command_args, input_data, level_from_report, parse_csv, shape_args
from builder.tuning.perf_analyzer import BINARY_ENV, PerfAnalyzerMissing, find_perf_analyzer, install_perf_analyzer

# perf_analyzer 2.51.0 -f report.csv --verbose-csv, digits_cnn over gRPC (a real run's file)
REPORT = """Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,\
Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,\
request/response,response wait
2,7269.04,3,268,302,14,405,96,1,950,1399,1636,3084,1092,4,1077
"""


def test_input_data_is_raw_rows_in_base64_with_their_shape():
    image = np.arange(2 * 3, dtype=np.float32).reshape(1, 2, 3)
    ids = np.array([[7, -1]], dtype=np.int64)
    data = input_data([{"image": image, "ids": ids}, {"image": image + 1, "ids": ids}], batching=True)
    assert data == {"data": [
        {"image": {"b64": "AAAAAAAAgD8AAABAAABAQAAAgEAAAKBA", "shape": [2, 3]},
         "ids": {"b64": "BwAAAAAAAAD//////////w==", "shape": [2]}},
        {"image": {"b64": "AACAPwAAAEAAAEBAAACAQAAAoEAAAMBA", "shape": [2, 3]},
         "ids": {"b64": "BwAAAAAAAAD//////////w==", "shape": [2]}},
    ]}
    back = np.frombuffer(base64.b64decode(data["data"][1]["image"]["b64"]), np.float32).reshape(2, 3)
    np.testing.assert_array_equal(back, image[0] + 1)  # exact: raw bytes, no decimal round trip
    json.dumps(data)  # what the engine writes
    # a model without a batch dimension: the array is the request
    assert input_data([{"x": np.ones((2,), np.float16)}], batching=False) == \
        {"data": [{"x": {"b64": "ADwAPA==", "shape": [2]}}]}
    with pytest.raises(UserInputError, match=r"input 'image': a request row of shape \[2, 2, 3\]; perf_analyzer "
                                             r"takes one row per step"):
        input_data([{"image": np.concatenate([image, image])}], batching=True)


def test_dynamic_dims_get_a_shape_argument_from_the_first_sample():
    inputs = [("ids", "INT64", [-1]), ("image", "FP32", [1, 8, 8])]
    samples = [{"ids": np.zeros((1, 12), np.int64), "image": np.zeros((1, 1, 8, 8), np.float32)}]
    assert shape_args(inputs, samples, batching=True) == ["--shape", "ids:12"]
    assert shape_args(inputs[1:], samples, batching=True) == []


def test_the_csv_report_parses_into_the_engines_result():
    [row] = parse_csv(REPORT)
    assert (row.concurrency, row.inferences_per_s, row.p50_us, row.p90_us, row.p95_us, row.p99_us, row.avg_us) == \
        (2, 7269.04, 950, 1399, 1636, 3084, 1092)
    assert (row.server_queue_us, row.server_compute_us, row.network_us) == (302, 14 + 405 + 96, 268)
    level = level_from_report(row, batch_size=4, requests=1200, stable=True, windows=3, seconds=1.5,
                              server={"average_batch_size": 6.2, "queue_us_per_request": 999.0}, client="pa")
    assert level.throughput == pytest.approx(7269.04 / 4)  # inferences are rows: requests carry 4
    assert (level.p50_ms, level.p90_ms, level.p99_ms, level.mean_ms) == (0.95, 1.399, 3.084, 1.092)
    out = level.as_row()
    assert out["server_queue_us"] == 302 and out["server_compute_us"] == 515  # perf_analyzer's, same windows
    assert out["server_avg_batch"] == 6.2 and out["failures"] == 0 and out["stable"] is True
    with pytest.raises(ValueError, match="perf_analyzer's report has no 'p99 latency' column"):
        parse_csv("Concurrency,Inferences/Second\n1,5\n")


def test_command_line(tmp_path):
    args = command_args("digits_cnn", "grpc://127.0.0.1:8001", "grpc", 16, tmp_path / "d.json", tmp_path / "r.csv",
                        batch_size=2, window_s=0.5, stability_pct=10, max_trials=16, shapes=["--shape", "ids:12"])
    assert args == ["-m", "digits_cnn", "-u", "127.0.0.1:8001", "-i", "grpc", "-b", "2", "--concurrency-range",
                    "16:16", "--measurement-mode", "time_windows", "--measurement-interval", "500", "-s", "10",
                    "--max-trials", "16", "--input-data", str(tmp_path / "d.json"), "-f", str(tmp_path / "r.csv"),
                    "--verbose-csv", "--shape", "ids:12"]


def test_a_missing_binary_falls_back_to_the_python_client_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "no" / "perf_analyzer"))
    said = []
    assert find_perf_analyzer() is None
    engine = choose_engine("auto", said.append)
    assert isinstance(engine, PythonEngine)
    assert len(said) == 1 and said[0].startswith(f"warning: ${BINARY_ENV} names {tmp_path}/no/perf_analyzer, which "
                                                 "is not an executable file")
    assert "measuring with the in-process Python client instead" in said[0]
    with pytest.raises(UserInputError, match=r"--engine perf_analyzer: \$TRITON_BUILDER_PERF_ANALYZER names .* not an "
                                             "executable file: point it at a perf_analyzer binary"):
        choose_engine("perf_analyzer")
    assert isinstance(choose_engine("python"), PythonEngine)
    with pytest.raises(UserInputError, match=r"unknown --engine 'locust'; supported: auto, perf_analyzer, python"):
        choose_engine("locust")


def test_an_install_without_a_package_index_says_how_to_install_by_hand(monkeypatch, tmp_path):
    monkeypatch.delenv(BINARY_ENV, raising=False)
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as offline: nothing to download from
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(PerfAnalyzerMissing, match=r"`pip download tritonclient==2.51.0` failed \(is PyPI reachable\?\)"
                                                  r".*To install it by hand: .*pip download --no-deps .*unzip -j "):
        install_perf_analyzer()
    assert [p.name for p in (tmp_path / "cache" / "perf_analyzer").iterdir()] == []  # no half install left
    said = []
    assert isinstance(choose_engine("auto", said.append, install=False), PythonEngine)
    assert "perf_analyzer is not installed" in said[-1]


def test_the_installed_binary_is_found_with_its_libraries():
    tool = find_perf_analyzer()
    if tool is None:
        pytest.skip("perf_analyzer not installed here (make setup installs it: scripts/install-perf-analyzer.sh)")
    assert {p.name for p in tool.lib_dir.iterdir()} >= {"libb64.so.0d", "libcudart.so.12"}
    assert all((tool.lib_dir / name).resolve().is_file() for name in ("libb64.so.0d", "libcudart.so.12"))
    assert tool.environment()["LD_LIBRARY_PATH"].split(":")[0] == str(tool.lib_dir)
    assert isinstance(choose_engine("auto", install=False), PerfAnalyzerEngine)


def test_the_server_view_covers_the_run_whose_figures_are_reported(monkeypatch, tmp_path):
    """A level that never settles is run again; Triton's counts must come from that second run only (an
    unsettled first run's executions were shown beside the re-run's requests: 14,964 for 2,965)."""
    import subprocess

    import builder.tuning.pa_measure  # binds _snapshot, server_view and run_command
    from builder.tuning.pa_measure import UNSTABLE, measure_with_perf_analyzer
    from builder.tuning.perf_analyzer import PerfAnalyzer

    counter = iter(range(100))
    monkeypatch.setattr(builder.tuning.pa_measure, "_snapshot", lambda stats, model: next(counter))
    monkeypatch.setattr(builder.tuning.pa_measure, "server_view", lambda before, after: {"span": (before, after)})
    runs = []

    def fake_run(command, timeout, env=None):
        runs.append(command)
        if len(runs) == 1:  # the first run never settles
            return subprocess.CompletedProcess(command, 99, f"{UNSTABLE} within 10 measurement windows", "")
        (tmp_path / "m_c4.csv").write_text(REPORT)
        return subprocess.CompletedProcess(command, 0, "Request count: 2965\n", "")
    monkeypatch.setattr(builder.tuning.pa_measure, "run_command", fake_run)
    level = measure_with_perf_analyzer(PerfAnalyzer(tmp_path / "perf_analyzer", None), "127.0.0.1:8001", "grpc", "m",
                                       4, tmp_path / "d.json", work_dir=tmp_path, stats=object())
    assert len(runs) == 2 and level.stable is False and level.requests == 2965
    assert level.server["span"] == (1, 2)  # snapshots 1 and 2 bracket the second run; 0 was the first run's
