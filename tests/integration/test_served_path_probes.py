"""Models whose verified variant used to pass the build and then not be served: built, served on the real
embedded tritonserver and checked over HTTP and gRPC.

- no batch dimension with a scalar input and a scalar output (Triton refused the config: "cannot have
  empty reshape for non-batching model"), as ONNX and as TorchScript;
- an input forward() never reads (the ONNX graph drops it; model.py fed it: "Invalid input name");
- a TorchScript model returning a dict, and one returning an LSTM's (out, (h, c)) (model.py zipped the
  names with the dict's keys: the stub crashed).
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from builder.pipeline import build
from builder.repository.config import config_as_dict
from builder.serving.check import check_served
from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer

pytestmark = pytest.mark.integration

MODELS = {
    "mbs0_scalars": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.proj = torch.nn.Linear(3, 4).double()
    def forward(self, pts, temperature):
        z = self.proj(pts) / temperature
        d = torch.cdist(z, z)
        return d, (d < 1.0).sum(), z.mean(0)
''', {"inputs": [{"name": "pts", "dtype": "float64", "shape": [-1, 3], "min_shape": [1, 3], "opt_shape": [10, 3],
                  "max_shape": [50, 3]},
                 {"name": "temperature", "dtype": "float64", "shape": [], "value_range": [0.5, 2.0]}],
      "outputs": [{"name": "dist"}, {"name": "close_pairs"}, {"name": "centroid"}], "max_batch_size": 0,
      "variants": ["onnx", "torchscript"]}),
    "passthru": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(6, 3)
    def forward(self, x, unused):
        return x, self.fc(x)
''', {"inputs": [{"name": "x", "dtype": "float32", "shape": [6]}, {"name": "unused", "dtype": "float32", "shape": [2]}],
      "outputs": [{"name": "echo"}, {"name": "y"}], "max_batch_size": 8,
      # onnx_opt: onnxslim drops the unused input from the graph (the legacy exporter does too)
      "variants": ["onnx", "onnx_opt", "torchscript"], "onnx": {"exporter": "legacy"}}),
    "dict_ts": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.a = torch.nn.Linear(6, 3); self.b = torch.nn.Linear(6, 2)
    def forward(self, x):
        return {"beta": self.b(x), "alpha": self.a(x)}
''', {"inputs": [{"name": "x", "dtype": "float32", "shape": [6]}], "outputs": [{"name": "beta"}, {"name": "alpha"}],
      "max_batch_size": 8, "variants": ["torchscript"]}),
    "lstm_ts": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.rnn = torch.nn.LSTM(4, 5, batch_first=True)
    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return out, (h.transpose(0, 1), c.transpose(0, 1))
''', {"inputs": [{"name": "x", "dtype": "float32", "shape": [7, 4]}],
      "outputs": [{"name": "out"}, {"name": "h"}, {"name": "c"}], "max_batch_size": 8, "variants": ["torchscript"]}),
}
SERVED = ["mbs0_scalars", "mbs0_scalars__torchscript", "passthru", "passthru__onnx_opt", "passthru__torchscript",
          "dict_ts", "lstm_ts"]


@pytest.fixture(scope="module")
def probes_served(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    repo = root / "model_repository"
    for name, (source, spec) in MODELS.items():
        folder = root / name
        folder.mkdir()
        (folder / "model.py").write_text(source.lstrip() + "\n\ndef build():\n    return M().eval()\n")
        data = {"name": name, "source": {"module": "model:build"}, **spec, "deploy": {"publish_variants": True,
                                                                                        "target": "python"}}
        (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        build(folder / "spec.yaml", repo, benchmark_seconds=0, progress=lambda _: None)
    server = EmbeddedServer(repo, ready_timeout=120)
    server.start()
    yield server, repo
    server.stop()


@pytest.mark.parametrize("model", SERVED)
def test_served_answers_match_the_reference_over_http_and_grpc(probes_served, model):
    server, repo = probes_served
    report = check_served(model, repository=repo, url=server.http_url, grpc_url=server.grpc_url, protocol="both")
    assert report.ok, report.lines()
    assert report.cases > 0 and set(report.metrics) == {"http", "grpc"}
    for metrics in report.metrics.values():
        assert all(m["rel_l2"] < 1e-5 and m["compared"] > 0 for m in metrics.values()), metrics


def test_unbatched_scalars_are_dims_1_without_reshape_and_answer_1(probes_served):
    server, repo = probes_served
    config = config_as_dict((repo / "mbs0_scalars" / "config.pbtxt").read_text())
    tensors = {t["name"]: t for t in config["input"] + config["output"]}
    assert tensors["temperature"]["dims"] == ["1"] and "reshape" not in tensors["temperature"]
    assert tensors["close_pairs"]["dims"] == ["1"] and "reshape" not in tensors["close_pairs"]
    assert config["parameters"]["scalar_tensors"]["string_value"] == "temperature,close_pairs"
    pts = np.random.default_rng(3).standard_normal((9, 3))
    with TritonClient(server.http_url, "http") as client:
        out = client.infer("mbs0_scalars", {"pts": pts, "temperature": np.array([1.5])})
    assert out["close_pairs"].shape == (1,) and out["dist"].shape == (9, 9) and out["centroid"].shape == (4,)


def test_the_unused_input_is_taken_from_clients_by_every_variant(probes_served):
    server, _ = probes_served
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    with TritonClient(server.http_url, "http") as client:
        for model in ("passthru", "passthru__onnx_opt", "passthru__torchscript"):
            out = client.infer(model, {"x": x, "unused": np.ones((2, 2), np.float32)})
            assert np.array_equal(out["echo"], x), model
