"""Serving built models on the real embedded tritonserver: the served accuracy gate over HTTP and
gRPC, dynamic batching seen through the statistics API, bad requests, and failures."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from builder.core.errors import ServerError
from builder.pipeline import build
from builder.serving.check import check_served
from builder.serving.embedded import EmbeddedServer
from tests.integration.conftest import reloaded
from tests.conftest import EXAMPLES, ROOT, run_cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model", ["digits_cnn", "bert_tiny"])
def test_check_passes_over_http_and_grpc(served, built_repository, model):
    report = check_served(model, repository=built_repository, url=served.http_url, grpc_url=served.grpc_url,
                          protocol="both")
    assert report.ok, report.lines()
    assert set(report.metrics) == {"http", "grpc"}
    for metrics in report.metrics.values():
        assert all(m["rel_l2"] < 1e-5 for m in metrics.values())
    assert report.cases >= 3


def test_check_warns_when_the_model_was_built_on_another_host(served, built_repository):
    import yaml

    meta = yaml.safe_load((built_repository / "digits_cnn" / "1" / "metadata.yaml").read_text())
    same = check_served("digits_cnn", repository=built_repository, url=served.http_url, grpc_url=served.grpc_url,
                        protocol="http", current_host=meta["host"])
    assert same.ok and same.host_warnings == []
    other = {**meta["host"], "isa_class": "other", "cpu_model": "Elsewhere CPU", "usable_cores": 64}
    report = check_served("digits_cnn", repository=built_repository, url=served.http_url, grpc_url=served.grpc_url,
                          protocol="http", current_host=other)
    assert report.ok  # a warning, not a failure: the answers still match
    assert len(report.host_warnings) == 1  # the machine's ISA; check's own cores say nothing about the server's
    assert any(line.startswith("- host: digits_cnn: variants were measured on") and "Elsewhere CPU" in line
               for line in report.lines())


def test_check_cli_exit_codes(served, built_repository):
    ok = run_cli("check", "digits_cnn", "--repository", str(built_repository), "--url", served.http_url,
                 "--grpc-url", served.grpc_url)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "digits_cnn version 1: OK" in ok.stdout
    unreachable = run_cli("check", "digits_cnn", "--repository", str(built_repository), "--url", "127.0.0.1:9")
    assert unreachable.returncode == 2 and "cannot reach Triton at 127.0.0.1:9" in unreachable.stderr


def test_check_contacts_only_the_protocols_asked_for(served, built_repository):
    # nothing listens on port 9: a gRPC-only check must not need HTTP, nor an HTTP-only one gRPC
    grpc_only = check_served("digits_cnn", repository=built_repository, url="127.0.0.1:9",
                             grpc_url=served.grpc_url, protocol="grpc")
    assert grpc_only.ok and set(grpc_only.metrics) == {"grpc"}, grpc_only.lines()
    assert grpc_only.config_differences == []  # the loaded config, read over gRPC
    http_only = check_served("digits_cnn", repository=built_repository, url=served.http_url,
                             grpc_url="127.0.0.1:9", protocol="http")
    assert http_only.ok and set(http_only.metrics) == {"http"}
    with pytest.raises(ServerError, match=r"cannot reach Triton at 127.0.0.1:9 over gRPC .*--grpc-url"):
        check_served("digits_cnn", repository=built_repository, url=served.http_url,
                     grpc_url="127.0.0.1:9", protocol="both")
    cli = run_cli("check", "digits_cnn", "--repository", str(built_repository), "--protocol", "grpc",
                  "--url", "127.0.0.1:9", "--grpc-url", served.grpc_url)
    assert cli.returncode == 0 and "digits_cnn version 1: OK" in cli.stdout, cli.stdout + cli.stderr


@pytest.fixture
def digits_with_queue_delay(served):
    """digits_cnn with a 200 ms queue delay, so 16 concurrent requests meet in the queue on any host
    however fast it executes (delay 0, the default, batches only what piles up by chance)."""
    def delay(config):
        config["dynamic_batching"] = dict(config.get("dynamic_batching") or {}, max_queue_delay_microseconds=200_000)

    with reloaded(served, "digits_cnn", delay) as server:
        yield server


def test_dynamic_batching_forms_batches_larger_than_one(digits_with_queue_delay):
    served = digits_with_queue_delay
    image = np.random.default_rng(0).random((1, 1, 8, 8), dtype=np.float32)

    def worker(_):
        client = httpclient.InferenceServerClient(served.http_url)
        for _ in range(5):
            item = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
            item.set_data_from_numpy(image)
            client.infer("digits_cnn", [item])
        client.close()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(worker, range(16)))
    with urllib.request.urlopen(f"http://{served.http_url}/v2/models/digits_cnn/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"][0]
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert max(sizes) > 1, f"no batch larger than 1 was formed: {sizes}"
    executed = sum(size * count for size, count in sizes.items())
    assert executed >= 16 * 5  # plus the model's warm-up sample


def _infer_raw(client, name, inputs):
    items = []
    for key, value in inputs.items():
        item = httpclient.InferInput(key, list(value.shape), {np.float32: "FP32", np.int64: "INT64",
                                                             np.float64: "FP64"}[value.dtype.type])
        item.set_data_from_numpy(value)
        items.append(item)
    return client.infer(name, items)


@pytest.mark.parametrize("model, inputs, message", [
    ("nope", {"image": np.zeros((1, 1, 8, 8), np.float32)}, r"(?i)(unknown model|not found)"),
    ("digits_cnn", {"picture": np.zeros((1, 1, 8, 8), np.float32)}, r"(?i)unexpected inference input 'picture'"),
    ("digits_cnn", {"image": np.zeros((1, 1, 8, 8), np.float64)}, r"data-type is 'FP64', but model 'digits_cnn' expects 'FP32'"),
    ("digits_cnn", {"image": np.zeros((1, 1, 9, 8), np.float32)}, r"(?i)unexpected shape"),
    ("digits_cnn", {"image": np.zeros((65, 1, 8, 8), np.float32)}, r"batch-size must be <= 64 for 'digits_cnn'"),
])
def test_bad_requests_get_clear_errors_and_server_stays_healthy(served, model, inputs, message):
    client = httpclient.InferenceServerClient(served.http_url)
    with pytest.raises(InferenceServerException, match=message):
        _infer_raw(client, model, inputs)
    assert client.is_server_ready() and client.is_model_ready("digits_cnn")
    good = _infer_raw(client, "digits_cnn", {"image": np.ones((2, 1, 8, 8), np.float32)})
    assert good.as_numpy("logits").shape == (2, 10)
    client.close()


def test_bad_request_over_grpc(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    item = grpcclient.InferInput("image", [1, 1, 9, 8], "FP32")
    item.set_data_from_numpy(np.zeros((1, 1, 9, 8), np.float32))
    with pytest.raises(InferenceServerException, match=r"(?i)unexpected shape"):
        client.infer("digits_cnn", [item])
    assert client.is_server_ready()
    client.close()


def _perturb_onnx(path):
    model = onnx.load(str(path))
    rng = np.random.default_rng(1)
    for init in model.graph.initializer:
        array = onnx.numpy_helper.to_array(init)
        if array.dtype == np.float32 and array.size > 100:
            init.CopyFrom(onnx.numpy_helper.from_array(array + rng.normal(0, 0.2, array.shape).astype(np.float32),
                                                       init.name))
    onnx.save(model, str(path))


def test_check_fails_with_per_output_list_when_served_model_differs(tmp_path, built_repository):
    repo = tmp_path / "repo"
    shutil.copytree(built_repository / "digits_cnn", repo / "digits_cnn")
    wrong = repo / "digits_cnn" / "2"
    shutil.copytree(repo / "digits_cnn" / "1", wrong)  # a "wrong version published by hand"
    _perturb_onnx(wrong / "model.onnx")
    with EmbeddedServer(repo) as server:
        report = check_served("digits_cnn", repository=repo, url=server.http_url, grpc_url=server.grpc_url)
        assert not report.ok
        assert any(re.match(r"http logits: rel L2 .* > 1e-05", f) for f in report.failures), report.failures
        assert any(f.startswith("grpc logits: rel L2") for f in report.failures)
        proc = run_cli("check", "digits_cnn", "--repository", str(repo), "--url", server.http_url,
                       "--grpc-url", server.grpc_url)
        assert proc.returncode == 1
        assert "- http logits: rel L2" in proc.stdout
        # version policy latest-1: version 1 is not loaded, which the gate reports as "not ready" (exit 2)
        with pytest.raises(ServerError, match=r"version 1 is not ready"):
            check_served("digits_cnn", repository=repo, url=server.http_url, grpc_url=server.grpc_url, version=1)


def test_check_reports_config_that_triton_changed(served, built_repository):
    from builder.serving.check import config_differences
    from builder.repository.config import config_as_dict

    intended = config_as_dict((built_repository / "digits_cnn" / "config.pbtxt").read_text())
    loaded = httpclient.InferenceServerClient(served.http_url).get_model_config("digits_cnn")
    assert config_differences(intended, loaded) == []
    loaded["max_batch_size"] = 8
    loaded["instance_group"][0]["count"] = 3
    differences = config_differences(intended, loaded)
    assert "max_batch_size: intended 64, loaded 8" in differences
    assert any(d.startswith("instance_group: intended [('KIND_CPU', 1)], loaded [('KIND_CPU', 3)]") for d in differences)


def test_serve_serves_standard_and_python_folders_and_leaves_out_a_plan(tmp_path, quiet):
    """A standard onnxruntime_onnx folder (target cpu) serves through the stand-in beside a python-backend one;
    a TensorRT plan folder - no stand-in here - is left out with the reason."""
    repo = tmp_path / "repo"
    build(EXAMPLES / "digits" / "spec.yaml", repo, variants=["onnx"], target="cpu", benchmark_seconds=0,
          progress=quiet)
    shutil.copytree(EXAMPLES / "digits", tmp_path / "d2")
    spec = (tmp_path / "d2" / "spec.yaml")
    spec.write_text(spec.read_text().replace("name: digits_cnn", "name: digits_py"))
    build(spec, repo, variants=["onnx"], benchmark_seconds=0, progress=quiet)
    (repo / "plan_model" / "1").mkdir(parents=True)
    (repo / "plan_model" / "config.pbtxt").write_text('name: "plan_model"\nplatform: "tensorrt_plan"\n')
    proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--repository", str(repo)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Stop with Ctrl-C" in line or not line:
                break
        text = "".join(lines)
        assert re.search(r"serving\s+digits_cnn, digits_py", text), text
        assert re.search(r"left out plan_model: .*tensorrt", text), text
        assert re.search(r"backend  onnxruntime: (Triton's C\+\+ backend \(r24\.10, onnxruntime 1\.19\.2\)|Python stand-in)",
                         text), text
        assert re.search(r"backend  openvino: Python stand-in .*: it loads the same standard folders", text), text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def test_serve_reports_a_killed_server_instead_of_hanging(built_repository):
    proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--repository", str(built_repository)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines = []
    try:
        deadline = time.time() + 60
        pid = None
        while time.time() < deadline and pid is None:
            line = proc.stdout.readline()
            lines.append(line)
            found = re.search(r"ready, pid (\d+)", line)
            pid = int(found.group(1)) if found else None
            if not line:
                break
        assert pid, "".join(lines)
        import os
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, out
    assert re.search(r"(?i)tritonserver (exited|died|ended)", out), out
