"""The served code path, replayed before a version is published: the version's own model.py runs in-process
with a stand-in triton_python_backend_utils on the reference cases and the warm-ups, and what it answers
must match the reference. Also the three ways it used to differ from the builder's runners: a TorchScript
dict / nested tuple result, an input the ONNX graph dropped, a scalar of a model without batching."""

from __future__ import annotations

import os
import types
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml

from builder.core.errors import InternalError, UserInputError, VerificationError
from builder.repository.config import ModelConfig, TensorConfig, Warmup, WarmupInput, parse_config, render_config
from builder.repository.description import VersionDescription
from builder.repository.metadata import reference_bytes
from builder.repository.publish import publish_model, python_backend_files
from builder.repository.served_replay import served_path_failures
from builder.model.runtime import open_runner

ROOT = Path(__file__).resolve().parents[2]


class DictOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"beta": self.b(x), "alpha": self.a(x)}  # spec order [beta, alpha], as verification requires


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return self.a(x), (self.b(x), x.sum(-1, keepdim=True))  # like an LSTM's (out, (h, c))


class PassThrough(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x, unused):
        return self.fc(x)


class ScalarInOut(torch.nn.Module):
    def forward(self, x, temperature):  # pair: [2] for a 0-d temperature, [2, 1] for the [1] clients send
        return torch.softmax(x / temperature, dim=-1), (x > 0).sum(), torch.stack([temperature, temperature * 2])


def _cases(batching: bool, make) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"id": f"b{n}", "inputs": make(rng, n)} for n in ((1, 3, 8) if batching else (2, 5))]


def _description(tmp_path, name, fmt, path, config, cases, model_py=None, extra=None):
    run = open_runner(fmt, path, [o.name for o in config.outputs], [i.name for i in config.inputs])
    outputs = [run(case["inputs"]) for case in cases]  # the builder's own runner: what verification saw
    runtime = python_backend_files(config)
    if model_py is not None:
        runtime["model.py"] = model_py
    return VersionDescription(name=name, config=config, model_format=fmt, model_files=[path], version=1,
                              runtime_files=runtime,
                              extra_files={"reference.npz": reference_bytes(cases, outputs), **(extra or {})},
                              metadata={"verification": {"tolerance": {"rel_l2": 1e-5}}})


def _python_config(name, runtime, inputs, outputs, max_batch_size=8, warm=None):
    return ModelConfig(name=name, backend="python", max_batch_size=max_batch_size, inputs=inputs, outputs=outputs,
                       warmups=[Warmup("warmup_batch1", 1, warm)] if warm else [],
                       parameters={"model_file": "model.pt" if runtime == "torchscript" else "model.onnx",
                                   "runtime": runtime, "intra_op_threads": "1", "non_finite_inputs": "count"})


def _torchscript(tmp_path, module):
    path = tmp_path / "model.pt"
    torch.jit.script(module).save(str(path))
    return path


def _dict_description(tmp_path, name="dict_ts", model_py=None):
    config = _python_config(name, "torchscript", [TensorConfig("x", "TYPE_FP32", [6])],
                            [TensorConfig("beta", "TYPE_FP32", [3]), TensorConfig("alpha", "TYPE_FP32", [3])],
                            warm=[WarmupInput("x", "TYPE_FP32", [6])])
    cases = _cases(True, lambda rng, n: {"x": rng.standard_normal((n, 6)).astype(np.float32)})
    return _description(tmp_path, name, "torchscript", _torchscript(tmp_path, DictOut()), config, cases, model_py)


def test_a_torchscript_dict_result_is_served_by_the_spec_names(tmp_path):
    torch.set_num_threads(3)
    assert served_path_failures(_dict_description(tmp_path)) == []
    assert torch.get_num_threads() == 3  # model.py's intra_op_threads (1) is process-wide: restored


def test_nested_tuples_are_flattened_as_verification_flattens_them(tmp_path):
    config = _python_config("nested", "torchscript", [TensorConfig("x", "TYPE_FP32", [6])],
                            [TensorConfig("out", "TYPE_FP32", [3]), TensorConfig("h", "TYPE_FP32", [2]),
                             TensorConfig("c", "TYPE_FP32", [1])])
    cases = _cases(True, lambda rng, n: {"x": rng.standard_normal((n, 6)).astype(np.float32)})
    description = _description(tmp_path, "nested", "torchscript", _torchscript(tmp_path, Nested()), config, cases)
    assert served_path_failures(description) == []


def _legacy_onnx(module, args, names, path, dynamic=True, outputs=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, input_names=names, output_names=outputs,
                          dynamic_axes={n: {0: "batch"} for n in names} if dynamic else None)
    return path


def test_an_input_the_onnx_graph_dropped_is_accepted_from_clients_and_not_fed(tmp_path):
    path = _legacy_onnx(PassThrough(), (torch.ones(2, 6), torch.ones(2, 2)), ["x", "unused"], tmp_path / "m.onnx",
                        outputs=["y"])
    assert [i.name for i in ort.InferenceSession(str(path)).get_inputs()] == ["x"]  # the legacy exporter dropped it
    config = _python_config("passthru", "onnxruntime",
                            [TensorConfig("x", "TYPE_FP32", [6]), TensorConfig("unused", "TYPE_FP32", [2])],
                            [TensorConfig("y", "TYPE_FP32", [3])],
                            warm=[WarmupInput("x", "TYPE_FP32", [6]), WarmupInput("unused", "TYPE_FP32", [2])])
    cases = _cases(True, lambda rng, n: {"x": rng.standard_normal((n, 6)).astype(np.float32),
                                         "unused": rng.standard_normal((n, 2)).astype(np.float32)})
    assert served_path_failures(_description(tmp_path, "passthru", "onnx", path, config, cases)) == []


def test_finalize_onnx_gives_back_a_spec_input_the_exporter_dropped(tmp_path):
    from builder.stages.common import finalize_onnx

    raw = _legacy_onnx(PassThrough(), (torch.ones(2, 6), torch.ones(2, 2)), ["x", "unused"], tmp_path / "raw.onnx",
                       outputs=["y"])
    spec = types.SimpleNamespace(batching=True, inputs=[types.SimpleNamespace(name="x", dtype="float32", shape=[6]),
                                                        types.SimpleNamespace(name="unused", dtype="float16",
                                                                              shape=[-1, 2])])
    finalize_onnx(raw, ["y"], rename=True, dest=tmp_path / "model.onnx", spec=spec)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    declared = {i.name: (i.type, i.shape) for i in session.get_inputs()}
    assert list(declared) == ["x", "unused"]
    assert declared["unused"] == ("tensor(float16)", ["batch", "unused_dim0", 2])
    # Triton's onnxruntime backend sends every config input: onnxruntime takes the unused one
    y, = session.run(None, {"x": np.ones((3, 6), np.float32), "unused": np.ones((3, 5, 2), np.float16)})
    assert y.shape == (3, 3)


def test_a_scalar_without_batching_is_dims_1_without_reshape_and_the_model_sees_0d(tmp_path):
    inputs = [TensorConfig.per_sample("x", "TYPE_FP32", [-1, 4], batching=False),
              TensorConfig.per_sample("temperature", "TYPE_FP32", [], batching=False)]
    outputs = [TensorConfig.per_sample("probs", "TYPE_FP32", [-1, 4], batching=False),
               TensorConfig.per_sample("positive", "TYPE_INT64", [], batching=False),
               TensorConfig.per_sample("pair", "TYPE_FP32", [2], batching=False)]
    config = _python_config("scalars", "onnxruntime", inputs, outputs, max_batch_size=0,
                            warm=[WarmupInput("x", "TYPE_FP32", [5, 4]), WarmupInput("temperature", "TYPE_FP32", [1])])
    text = render_config(config)
    assert "reshape" not in text  # Triton: "cannot have empty reshape for non-batching model"
    assert 'key: "scalar_tensors"\n  value { string_value: "temperature,positive" }' in text
    path = _legacy_onnx(ScalarInOut(), (torch.ones(5, 4), torch.tensor(2.0)), ["x", "temperature"],
                        tmp_path / "m.onnx", dynamic=False, outputs=["probs", "positive", "pair"])
    cases = _cases(False, lambda rng, n: {"x": rng.standard_normal((5, 4)).astype(np.float32),
                                          "temperature": np.array(rng.uniform(0.5, 2.0), np.float32)})
    description = _description(tmp_path, "scalars", "onnx", path, config, cases)
    assert served_path_failures(description) == []

    from builder.repository.warmup import warmup_inputs
    feed, = warmup_inputs(description)  # the warm-up replay gives the runner what model.py gives it
    assert feed["temperature"].shape == () and feed["x"].shape == (5, 4)


def test_triton_rules_refuse_an_empty_reshape_without_batching():
    with pytest.raises(InternalError, match=r"tensor t: reshape \[\] without a batch dimension \(max_batch_size 0\) "
                                            r"is refused by Triton; make it with TensorConfig.per_sample\(\.\.\., "
                                            r"batching=False\)"):
        ModelConfig(name="m", backend="python", max_batch_size=0, inputs=[TensorConfig("t", "TYPE_FP32", [1], [])],
                    outputs=[TensorConfig("y", "TYPE_FP32", [1])])


@pytest.mark.parametrize("backend, library", [("onnxruntime_onnx", "onnxruntime"), ("pytorch_libtorch", "pytorch"),
                                              ("openvino", "openvino")])
def test_a_backend_other_than_python_refuses_a_scalar_without_batching(backend, library):
    with pytest.raises(UserInputError, match=rf"field 'outputs': output 'close_pairs' is a scalar \(shape \[\]\) and "
                                             rf"max_batch_size is 0: Triton's {library} backend cannot serve a scalar "
                                             r"without a batch dimension .* Fix: deploy.target python \(the python "
                                             r"backend serves it as dims \[1\]\), or max_batch_size > 0, or make the "
                                             r"model take/return 'close_pairs' as shape \[1\]"):
        ModelConfig(name="m", backend=backend, max_batch_size=0,
                    inputs=[TensorConfig.per_sample("pts", "TYPE_FP64", [-1, 3], batching=False)],
                    outputs=[TensorConfig.per_sample("close_pairs", "TYPE_INT64", [], batching=False)])


def test_the_recorded_interface_of_an_unbatched_scalar_matches_its_config(tmp_path):
    from builder.repository.interface import version_mismatch

    config = _python_config("scalars", "onnxruntime",
                            [TensorConfig.per_sample("temperature", "TYPE_FP32", [], batching=False)],
                            [TensorConfig.per_sample("n", "TYPE_INT64", [], batching=False)], max_batch_size=0)
    meta = {"spec": {"max_batch_size": 0, "inputs": [{"name": "temperature", "dtype": "float32", "shape": []}],
                     "outputs": [{"name": "n", "dtype": "int64", "shape": []}]}, "artifact": {"backend": "python"}}
    assert version_mismatch(meta, parse_config(render_config(config))) == []


def test_a_served_model_py_that_answers_otherwise_is_not_published_and_says_why(tmp_path):
    # a model.py that labels the outputs in the wrong order (as the old one did with a TorchScript dict)
    served = tmp_path / "model.py"
    text = (ROOT / "templates/python_backend/model.py").read_text()
    wrong = text.replace("(t.cpu().numpy() for t in _tensors(result))", "(t.cpu().numpy() for t in _tensors(result)[::-1])")
    assert wrong != text
    served.write_text(wrong)
    repo = tmp_path / "repo"
    with pytest.raises(VerificationError) as raised:
        publish_model(repo, _dict_description(tmp_path, "dict_ts", model_py=served))
    message = str(raised.value)
    assert message.startswith("'dict_ts' version 1 was not published: its model.py, run in-process as Triton's "
                              "python backend runs it, fails where the build's verification (the builder's own runner "
                              "on the same torchscript file) passed, so Triton would not serve it as verified; nothing "
                              "of it was written"), message
    assert "- reference cases: beta: rel L2" in message and "- reference cases: alpha: rel L2" in message
    assert not (repo / "dict_ts").exists()


def test_the_replay_leaves_nothing_in_the_version_folder_or_dev_shm(tmp_path):
    from builder.monitoring.drift_profile import build_profile, profile_text

    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    profile = profile_text(build_profile({"x": x}, {"beta": x[:, :3], "alpha": x[:, 3:]})).encode()
    description = _dict_description(tmp_path, "drift_replay_7f3a")
    description = VersionDescription(**{**description.__dict__,
                                        "extra_files": {**description.extra_files, "drift_profile.json": profile}})
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    published = publish_model(tmp_path / "repo", description)
    assert sorted(os.listdir(published["path"])) == ["drift.py", "drift_profile.json", "metadata.yaml", "model.pt",
                                                     "model.py", "reference.npz"]
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not [n for n in shm_after - shm_before if "drift_replay_7f3a" in n]


def test_a_model_py_of_an_older_release_is_replayed_as_it_is(tmp_path):
    """select and tune --publish copy the served version's model.py: one published before the shared drift
    window (no _SharedWindow) crashed the replay, so neither could publish."""
    served = tmp_path / "model.py"
    text = (ROOT / "templates/python_backend/model.py").read_text()
    served.write_text(text.replace("_SharedWindow", "_WindowOfAnOlderRelease"))
    published = publish_model(tmp_path / "repo", _dict_description(tmp_path, "dict_ts", model_py=served))
    assert published["version"] == 1


def test_a_replay_folder_a_killed_build_left_is_removed_by_the_next_replay(tmp_path, monkeypatch):
    import tempfile

    from builder.repository.served_replay import REPLAY_PREFIX

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    left = scratch / f"{REPLAY_PREFIX}999999999-dead"  # its owner's pid, long gone
    (left / "dict_ts" / "1").mkdir(parents=True)
    publish_model(tmp_path / "repo", _dict_description(tmp_path, "dict_ts"))
    assert not left.exists() and not list(scratch.glob(REPLAY_PREFIX + "*"))  # and its own is gone too


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_an_unbatched_scalar_input_for_another_backend_is_refused_before_the_build(tmp_path, target):
    from builder.pipeline import build

    (tmp_path / "model.py").write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x, t):\n"
                                       "        return x * t\ndef build():\n    return M()\n")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "m", "source": {"module": "model:build"}, "max_batch_size": 0,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}, {"name": "t", "dtype": "float32", "shape": []}],
        "outputs": [{"name": "y"}]}))
    said = []
    with pytest.raises(UserInputError, match=rf"input 't': shape \[\] with max_batch_size 0 and target {target}: "
                                             r"Triton's own backends cannot serve a scalar"):
        build(tmp_path / "spec.yaml", tmp_path / "repo", target=target, progress=said.append)
    assert not any(line.startswith("[1/") for line in said)  # before the first stage
