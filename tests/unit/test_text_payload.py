"""Text (BYTES / TYPE_STRING) inputs through every load and measurement path, without a server: strings in a
payload .npz (numpy unicode or bytes arrays, never pickled objects) read by builder/tuning/payload.py and by
Locust's own reader (loadtest/triton_target.py) alike; generated short ASCII texts for a BYTES input; a
pipeline ensemble's default payload from its pipeline_reference.json; text steps in perf_analyzer's
--input-data JSON; and the per-step split of an ensemble's time from Triton's statistics."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.tuning.loadtest import LOADTEST_DIR
from builder.tuning.pa_measure import input_data, shape_args
from builder.tuning.payload import (ModelInterface, default_payload, generated_samples, load_samples,
                                    locust_payload, make_requests)
from builder.tuning.stats import StatsSnapshot
from builder.tuning.steps import ensemble_steps, format_step_table, step_split

TEXTS = ["The service was quick.", "Awful, broken, useless", "Ünïcode café ☕"]
PIPE = ModelInterface("sent", [("text", "BYTES", [1])], ["label", "score", "scores"], 16, {})


def _target_module():
    spec = importlib.util.spec_from_file_location("triton_target_text", LOADTEST_DIR / "triton_target.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pipeline_repository(tmp_path: Path, texts=TEXTS) -> Path:
    """The folders a Hugging Face build publishes (configs reduced to what the layout reads)."""
    repo = tmp_path / "repo"
    for name, text in (("sent", 'name: "sent"\nplatform: "ensemble"\n'), ("sent__preprocess", 'backend: "python"\n'),
                       ("sent__model", 'platform: "onnxruntime_onnx"\n'), ("sent__postprocess", 'backend: "python"\n')):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    (repo / "sent__model" / "2").mkdir()
    (repo / "sent__model" / "1" / "pipeline_reference.json").write_text(json.dumps({"texts": ["old"]}))
    (repo / "sent__model" / "2" / "pipeline_reference.json").write_text(
        json.dumps({"texts": texts, "labels": ["POSITIVE"] * len(texts), "library": "transformers 5"}))
    (repo / "sent__model" / "2" / "reference.npz").write_bytes(b"")  # token ids: never the ensemble's payload
    return repo


@pytest.mark.parametrize("dtype", [str, bytes])
def test_strings_in_a_payload_npz_are_sent_as_bytes_by_both_readers(tmp_path, dtype):
    values = [t.encode("utf-8") for t in TEXTS] if dtype is bytes else TEXTS
    path = tmp_path / "texts.npz"
    np.savez(path, text=np.array(values).reshape(-1, 1), labels=np.arange(3))
    samples, source = load_samples(PIPE, path)
    assert source == str(path) and len(samples) == 3
    assert all(s["text"].dtype == object and s["text"].shape == (1, 1) for s in samples)
    assert [s["text"][0, 0] for s in samples] == [t.encode("utf-8") for t in TEXTS]
    assert make_requests(samples, 2)[0]["text"].reshape(-1).tolist() == [TEXTS[0].encode(), TEXTS[1].encode()]

    target = _target_module()  # Locust's reader, which runs without this package
    rows = target._as_model_dtypes(target._read_npz(path, ["text"], True), [("text", "BYTES", [1])])
    assert [r["text"].reshape(-1).tolist() for r in rows] == [[t.encode("utf-8")] for t in TEXTS]
    assert all(r["text"].dtype == object for r in rows)


def test_a_one_dimensional_string_array_travels_as_dims_1(tmp_path):
    np.savez(tmp_path / "flat.npz", text=np.array(TEXTS))
    samples, _ = load_samples(PIPE, tmp_path / "flat.npz")
    assert samples[0]["text"].shape == (1, 1) and samples[0]["text"][0, 0] == TEXTS[0].encode()


def test_numbers_for_a_text_input_and_pickled_objects_are_refused_naming_the_fix(tmp_path):
    np.savez(tmp_path / "numbers.npz", text=np.zeros((3, 1), np.float32))
    with pytest.raises(UserInputError, match=r"numbers.npz\['text'\] is float32, the model takes text \(BYTES\): "
                                             r"save it as a numpy string array"):
        load_samples(PIPE, tmp_path / "numbers.npz")
    np.savez(tmp_path / "objects.npz", text=np.array([["a"], ["b"]], dtype=object))  # needs pickle to read
    with pytest.raises(UserInputError, match=r"never unpickled: .*texts as numpy string arrays"):
        load_samples(PIPE, tmp_path / "objects.npz")
    target = _target_module()
    with pytest.raises(ValueError, match="'text' is float64, the model takes text"):
        target._as_model_dtypes([{"text": np.zeros((1, 1))}], [("text", "BYTES", [1])])


def test_generated_inputs_for_a_bytes_input_are_short_ascii_texts_on_both_paths():
    samples = generated_samples(PIPE, count=8)
    values = [s["text"].reshape(-1)[0] for s in samples]
    assert all(s["text"].shape == (1, 1) and s["text"].dtype == object for s in samples)
    assert all(isinstance(v, bytes) and v.isascii() and 5 < len(v) < 120 for v in values)
    assert len(set(values)) > 3 and values == [s["text"].reshape(-1)[0] for s in generated_samples(PIPE, count=8)]

    target = _target_module()
    locust = target._generate([("text", "BYTES", [1]), ("ids", "INT64", [-1])], True, count=4)
    assert all(s["text"].shape == (1, 1) and s["text"][0, 0].isascii() for s in locust)
    assert locust[0]["ids"].shape == (1, 16)
    multi = generated_samples(ModelInterface("m", [("t", "BYTES", [-1, 2])], ["o"], 0, {}), count=1)[0]["t"]
    assert multi.shape == (1, 2) and all(isinstance(v, bytes) for v in multi.reshape(-1))


def test_a_pipeline_ensemble_sends_the_texts_of_its_latest_pipeline_reference_by_default(tmp_path):
    repo = _pipeline_repository(tmp_path)
    reference = repo / "sent__model" / "2" / "pipeline_reference.json"
    samples, source = load_samples(PIPE, repository=repo)  # sweep and tune
    assert source == f"the 3 texts of {reference}"
    assert [s["text"].tolist() for s in samples] == [[[t.encode("utf-8")]] for t in TEXTS]

    path, source = locust_payload(PIPE, None, repo)  # loadtest: an .npz Locust reads by itself
    assert source == f"the 3 texts of {reference}" and path.parts[-2:] == ("sent-v2-texts", "texts.npz")
    with np.load(path, allow_pickle=False) as archive:
        assert archive.files == ["text"] and archive["text"].dtype.kind == "U"
        assert archive["text"].reshape(-1).tolist() == TEXTS
    assert default_payload(repo, "sent") == path
    target = _target_module()
    rows = target._as_model_dtypes(target._read_npz(path, ["text"], True), [("text", "BYTES", [1])])
    assert [r["text"].tolist() for r in rows] == [[[t.encode("utf-8")]] for t in TEXTS]


def test_a_pipeline_without_reference_texts_falls_back_to_generated_texts(tmp_path):
    repo = _pipeline_repository(tmp_path, texts=[])
    samples, source = load_samples(PIPE, repository=repo)
    assert source == "generated from the model's metadata" and samples[0]["text"].dtype == object
    assert locust_payload(PIPE, None, repo)[0] is None


def test_locust_requests_carry_bytes_inputs():
    import tritonclient.http as http

    target = _target_module()
    item = object.__new__(target.Target)
    item.samples = [{"text": np.array([["héllo".encode()]], dtype=object)}]
    item.module, item.outputs = http, ["label"]
    [(inputs, outputs)] = item.requests()
    assert inputs[0].datatype() == "BYTES" and inputs[0].shape() == [1, 1]


def test_text_steps_go_to_perf_analyzer_as_strings():
    samples = [{"text": np.array([["The service was quick.".encode()]], dtype=object)},
               {"text": np.array([["Ünïcode café ☕"]])}]
    data = input_data(samples, batching=True)
    assert data == {"data": [{"text": {"content": ["The service was quick."], "shape": [1]}},
                             {"text": {"content": ["Ünïcode café ☕"], "shape": [1]}}]}
    json.dumps(data)  # what --input-data gets
    assert shape_args([("text", "BYTES", [1])], samples, True) == []
    mixed = input_data([{"text": np.array([[b"a"]], dtype=object), "ids": np.array([[1, 2]], np.int64)}], True)
    assert mixed["data"][0]["ids"]["shape"] == [2] and "b64" in mixed["data"][0]["ids"]
    with pytest.raises(UserInputError, match="not UTF-8 text"):
        input_data([{"text": np.array([[b"\xff\xfe"]], dtype=object)}], True)


def _snap(success, success_ms, queue_ms, input_ms, infer_ms, output_ms, executions=None):
    snap = StatsSnapshot(success=success, success_ns=int(success_ms * 1e6), inferences=success,
                         executions=executions if executions is not None else success)
    snap.ns = {"queue": int(queue_ms * 1e6), "compute_input": int(input_ms * 1e6),
               "compute_infer": int(infer_ms * 1e6), "compute_output": int(output_ms * 1e6)}
    return snap


def test_the_ensemble_time_is_split_per_step_and_the_handover_is_not_counted_twice():
    config = {"platform": "ensemble", "ensemble_scheduling": {"step": [
        {"model_name": "sent__preprocess"}, {"model_name": "sent__model"}, {"model_name": "sent__postprocess"}]}}
    steps = ensemble_steps(config)
    assert steps == ["sent__preprocess", "sent__model", "sent__postprocess"] and ensemble_steps({"platform": "x"}) == []
    zero = {name: _snap(0, 0, 0, 0, 0, 0) for name in ["sent", *steps]}
    # 100 requests: the server's figures per request at concurrency 1 on the MiniLM pipeline, in ms
    after = {"sent": _snap(100, 912.2, 0.3, 9.1, 791.5, 265.5),
             "sent__preprocess": _snap(100, 313.6, 5.2, 3.1, 93.0, 212.0),
             "sent__model": _snap(100, 630.1, 6.3, 1.9, 601.2, 20.6, executions=50),
             "sent__postprocess": _snap(100, 187.4, 52.9, 4.1, 97.3, 32.9)}
    split = step_split("sent", steps, zero, after)
    assert split["requests"] == 100 and split["end_to_end_us"] == 9122.0
    tokenizer, model, post = split["steps"]
    assert (tokenizer["role"], tokenizer["queue_us"], tokenizer["compute_us"], tokenizer["handover_us"]) == \
        ("tokenizer", 52.0, 961.0, 2120.0)
    assert model["total_us"] == 6094.0 and model["average_batch_size"] == 2.0
    assert post["total_us"] == 529.0 + 41.0 + 973.0 + 329.0 and post["handover_us"] == 0.0  # the last: output counts
    assert split["overhead_us"] == pytest.approx(9122.0 - 1013.0 - 6094.0 - 1872.0)
    assert step_split("sent", steps, zero, zero)["error"] == "the ensemble answered no request in the window"
    table = format_step_table([(1, split), (4, split), (8, {"error": "x", "requests": 0})])
    lines = table.splitlines()
    assert "c=1" in lines[0] and "c=4" in lines[0] and "c=8" not in lines[0]  # a level without figures is left out
    assert "tokenizer (sent__preprocess)" in table and "52 + 961 (11%)" in table
    assert lines[-2].startswith("ensemble overhead") and lines[-1].split("|")[-1].strip() == "9,122"
    assert format_step_table([]) == ""


def test_an_ensembles_formed_batches_are_its_model_steps():
    from builder.tuning.loadtest import format_summary
    from builder.tuning.steps import model_step

    steps = ["sent__preprocess", "sent__model", "sent__postprocess"]
    assert model_step("sent", steps) == "sent__model" and model_step("sent", ["other"]) is None
    zero = {name: _snap(0, 0, 0, 0, 0, 0) for name in ["sent", *steps]}
    after = {name: _snap(100, 500, 1, 1, 1, 1) for name in ["sent", *steps]}
    after["sent__model"].batches = {1: 20, 2: 10, 4: 15}  # 100 requests in 45 executions
    after["sent__model"].executions = 45
    model = step_split("sent", steps, zero, after)["steps"][1]
    assert model["batch_sizes"] == {"1": 20, "2": 10, "4": 15} and model["average_batch_size"] == 2.22
    step = {"name": "sent__model", "error": None, "executions": 45, "average_batch_size": 2.22,
            "batch_sizes": {"1": 20, "2": 10, "4": 15}}
    server = {"requests": 100, "error": None, "queue_us_per_request": 5.0, "compute_us_per_request": 900.0,
              "average_batch_size": None, "batch_sizes": {}}
    summary = {"model": "sent", "protocol": "grpc", "users": 8, "server": server, "model_step": step,
               "client": {"requests": 100, "failures": 0, "rps": 90.0, "errors": {}}, "slo": {"met": True}}
    line = format_summary(summary)
    assert "; server: queue 5 us + compute 900 us per request; model step sent__model: avg formed batch 2.22 " \
           "(1x20 2x10 4x15)" in line and "avg batch None" not in line
