"""The user's model files as stage load reads them (builder.model.source): whatever the user's code
does at import or in the factory, and whatever file the weights are, the build ends with one message
naming the file (and line) and the fix - exit 2, never a traceback or a silent exit 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builder.core.errors import UserInputError
from builder.model.source import import_factory, load_weights
from tests.conftest import run_cli
from tests.tiny_models import write_model


def factory_in(tmp_path, text: str, name: str = "model", ref: str = "model:build"):
    (tmp_path / f"{name}.py").write_text(text)
    return lambda: import_factory(ref, tmp_path, "spec.yaml")


@pytest.mark.slow(reason="runs a build through the CLI in a subprocess")
def test_sys_exit_in_the_factory_is_a_user_error_exit_2(tmp_path):
    spec = write_model(tmp_path, "argmax")
    (spec.parent / "model.py").write_text("import sys\ndef build():\n    sys.exit(0)\n")
    proc = run_cli("build", str(spec), "--repository", str(tmp_path / "repo"), "--benchmark-seconds", "0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "field 'source.module': model:build() exited (SystemExit 0)" in proc.stderr
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_sys_exit_at_import_names_the_file(tmp_path):
    with pytest.raises(UserInputError, match=r"field 'source.module': importing model.py exited \(SystemExit 3\)"):
        factory_in(tmp_path, "import sys\nsys.exit(3)\n")()


def test_a_syntax_error_names_the_file_and_line(tmp_path):
    with pytest.raises(UserInputError, match=r"field 'source.module': model.py line 2: SyntaxError: invalid syntax; "
                                             r"fix the syntax"):
        factory_in(tmp_path, "import torch\ndef build(:\n    pass\n")()


def test_an_exception_at_import_names_the_file_line_and_text(tmp_path):
    (tmp_path / "helpers.py").write_text("x = 1\nraise RuntimeError('CUDA not available')\n")
    with pytest.raises(UserInputError, match=r"importing model.py raised RuntimeError at helpers.py line 2: CUDA "
                                             r"not available; fix model.py so that it imports"):
        factory_in(tmp_path, "import helpers\ndef build(): pass\n")()


def test_a_missing_dependency_is_named_as_such(tmp_path):
    with pytest.raises(UserInputError, match=r"model.py line 2 imports 'nosuchpkg_xyz', which is not installed in "
                                             r"this environment \(.*\); install it there, or remove the import"):
        factory_in(tmp_path, "import torch\nimport nosuchpkg_xyz\ndef build(): pass\n")()
    # the module itself missing keeps its own advice
    with pytest.raises(UserInputError, match=r"cannot import 'other' .* so put other.py there"):
        import_factory("other:build", tmp_path, "spec.yaml")


@pytest.fixture
def linear():
    return torch.nn.Linear(4, 3)


def test_weights_in_an_unsupported_format_say_so(tmp_path, linear):
    npz = tmp_path / "w.npz"
    np.savez(npz, **{k: v.detach().numpy() for k, v in linear.state_dict().items()})
    text = tmp_path / "w.bin"
    text.write_text("hello weights\n")
    for path, kind in ((npz, "a NumPy .npz archive"), (text, "not a weights file this tool reads")):
        with pytest.raises(UserInputError, match=rf"source.weights: .*{path.name} is {kind}: unsupported weights "
                                                 r"format: use .safetensors or a torch.save\(state_dict\) file"):
            load_weights(linear, path)


def test_weights_formats_are_read_whatever_their_suffix(tmp_path, linear):
    from safetensors.torch import save_file
    state = {k: torch.ones_like(v) for k, v in linear.state_dict().items()}
    save_file(state, str(tmp_path / "w.bin"))
    torch.save(state, tmp_path / "w.pth")
    for name in ("w.bin", "w.pth"):
        torch.nn.init.zeros_(linear.weight)
        load_weights(linear, tmp_path / name)
        assert float(linear.weight.detach().sum()) == 12.0


def test_weights_that_do_not_fit_end_with_one_full_stop(tmp_path, linear):
    torch.save({"weight": linear.weight}, tmp_path / "w.pt")
    with pytest.raises(UserInputError, match=r'Missing key\(s\) in state_dict: "bias"\. Use the weights saved') as info:
        load_weights(linear, tmp_path / "w.pt")
    assert ".." not in str(info.value)
    torch.save({"weight": torch.zeros(3, 5), "bias": linear.bias}, tmp_path / "w.pt")
    with pytest.raises(UserInputError, match=r"torch.Size\(\[3, 4\]\)\. Use the weights saved"):
        load_weights(linear, tmp_path / "w.pt")


def test_a_weights_path_that_is_a_directory_is_said_to_be_one(tmp_path):
    from builder.spec.model import parse_spec
    (tmp_path / "w.safetensors").mkdir()
    raw = {"name": "m", "source": {"module": "model:build", "weights": "w.safetensors"}, "max_batch_size": 8,
           "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}]}
    with pytest.raises(UserInputError, match=r"field 'source.weights': .*w.safetensors is a directory; give the file"):
        parse_spec(raw, tmp_path / "spec.yaml")


@pytest.mark.parametrize("forward", ["return self.fc(torch.nn.functional.dropout(x, 0.5, training=True))",
                                     "return self.fc(x) + torch.randn(x.shape[0], 4)"])
def test_a_model_that_is_not_deterministic_is_refused_at_load(tmp_path, quiet, forward):
    from builder.pipeline import build
    spec = write_model(tmp_path, "argmax", inputs=[{"name": "x", "dtype": "float32", "shape": [6]}],
                       outputs=[{"name": "probs"}])
    (spec.parent / "model.py").write_text(
        "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__(); "
        "self.fc = torch.nn.Linear(6, 4)\n    def forward(self, x):\n        " + forward + "\n"
        "def build():\n    return M()\n")
    with pytest.raises(UserInputError, match=r"spec.yaml: field 'source': the model is not deterministic: two runs "
                                             r"on the same inputs differ \(output 'probs': rel L2 \d\.\de[+-]\d\d\) - "
                                             r"dropout with training=True or random ops in forward\(\); make "
                                             r"forward\(\) deterministic in eval mode"):
        build(spec, tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_determinism_is_judged_per_output_with_a_tiny_tolerance():
    from builder.model.source import check_deterministic
    a = {"y": np.ones(8, np.float32), "ids": np.arange(3)}
    check_deterministic(a, {"y": a["y"] * (1 + 1e-8), "ids": np.arange(3)}, "spec.yaml")  # rounding: fine
    with pytest.raises(UserInputError, match=r"output 'ids': rel L2 .*, 1 values differ\) - dropout"):
        check_deterministic(a, {"y": a["y"], "ids": np.array([0, 1, 3])}, "spec.yaml")
    with pytest.raises(UserInputError, match=r"output 'y' has shape \[8\], then \[4\]\) - random ops in the graph"):
        check_deterministic(a, {"y": a["y"][:4], "ids": a["ids"]}, "spec.yaml", kind="onnx")


def test_metadata_records_the_module_source_files_and_weights_it_was_built_from(tmp_path, quiet):
    import yaml
    from safetensors.torch import save_file

    from builder.core.files import sha256_file
    from builder.pipeline import build
    spec = write_model(tmp_path, "argmax")
    folder = spec.parent
    (folder / "layers.py").write_text("import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n"
                                      "        super().__init__(); self.fc = torch.nn.Linear(6, 4)\n"
                                      "    def forward(self, x, temperature):\n"
                                      "        logits = self.fc(x) / temperature.unsqueeze(-1)\n"
                                      "        return logits.argmax(dim=-1), logits.softmax(-1)\n")
    (folder / "model.py").write_text("from layers import M\n\ndef build():\n    return M()\n")
    (folder / "sub").mkdir()
    save_file({f"fc.{k}": torch.randn_like(v) for k, v in torch.nn.Linear(6, 4).state_dict().items()},
              str(folder / "sub" / "w.safetensors"))
    data = yaml.safe_load(spec.read_text())
    data["source"]["weights"] = "sub/w.safetensors"
    data["variants"] = ["onnx"]
    spec.write_text(yaml.safe_dump(data))
    build(spec, tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    meta = yaml.safe_load((tmp_path / "repo" / "argmax" / "1" / "metadata.yaml").read_text())
    assert meta["source"]["sha256"] == {name: sha256_file(folder / name)
                                        for name in ("model.py", "layers.py", "sub/w.safetensors")}


def test_a_model_that_works_on_its_input_in_place_is_built_and_verified(tmp_path, quiet):
    """x.mul_(2) on the input: each run gets its own copy, so the stored reference cases stay what they were
    (they changed under the first run, and the second run read that as randomness)."""
    from builder.pipeline import build
    from builder.model.runtime import torch_runner
    spec = write_model(tmp_path, "argmax", inputs=[{"name": "x", "dtype": "float32", "shape": [6]}],
                       outputs=[{"name": "probs"}])
    (spec.parent / "model.py").write_text(
        "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__(); "
        "torch.manual_seed(0); self.fc = torch.nn.Linear(6, 4)\n    def forward(self, x):\n        x.mul_(2.0)\n"
        "        x.add_(1.0)\n        return self.fc(x)\ndef build():\n    return M().eval()\n")
    class InPlace(torch.nn.Module):
        def forward(self, x):
            return x.mul_(2.0)

    x = np.ones((2, 6), np.float32)
    assert torch_runner(InPlace(), ["y"])({"x": x})["y"].max() == 2.0 and x.max() == 1.0  # the caller's array kept
    result = build(spec, tmp_path / "repo", variants=["onnx", "torchscript"], benchmark_seconds=0, progress=quiet)
    assert all(v.verified for v in result.context.variants), [v.rejected for v in result.context.variants]
