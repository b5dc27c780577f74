"""OpenVINO input ports are fed by the spec's input names even when compile_model has merged the
name of a cast into the port (``ids.long()`` on an int32 input: the port answers to 'ids' and to
the Cast's output name, and ``get_any_name()`` returns the latter). Without that the variant was
lost with the reason "the variant failed to run: '_to_copy'"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from builder.optimise.openvino_tools import input_feeds, openvino_runner
from builder.pipeline import build

MODEL = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8); self.fc = torch.nn.Linear(8, 3)
    def forward(self, ids):
        return self.fc(self.emb(ids.long()).mean(1))

def build():
    return M().eval()
'''


@pytest.fixture(scope="module")
def cast_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("ov_names")
    folder = root / "cast"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL)
    spec = {"name": "cast", "source": {"module": "model:build"},
            "inputs": [{"name": "ids", "dtype": "int32", "shape": [6], "value_range": [0, 50]}],
            "outputs": [{"name": "logits"}], "max_batch_size": 4}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    repo = root / "repo"
    # target python: the IR runs in f32 on every CPU (for Triton's openvino backend it runs at the plugin's
    # default precision, bf16 on some CPUs: tests/unit/test_openvino.py), so the cast's cost alone is measured
    result = build(folder / "spec.yaml", repo, variants=["onnx", "openvino"], benchmark_seconds=0,
                   publish_variants=True, target="python", progress=lambda m: None)
    return result, repo


def test_an_input_cast_first_does_not_cost_the_openvino_variant(cast_build):
    result, _ = cast_build
    variant = result.context.variant("openvino")
    assert variant.verified is True, variant.rejected
    assert variant.verification["metrics"]["logits"]["rel_l2"] < 1e-5


def test_the_runner_feeds_the_port_by_the_name_the_caller_knows(cast_build):
    import numpy as np

    _, repo = cast_build
    run = openvino_runner(repo / "cast__openvino" / "1" / "model.xml", ["logits"])
    port = run.compiled.inputs[0]
    assert "ids" in port.get_names()
    ids = np.random.default_rng(0).integers(0, 50, (2, 6)).astype(np.int32)
    assert run({"ids": ids})["logits"].shape == (2, 3)


def _port(*names):
    return SimpleNamespace(get_names=lambda: set(names))


def test_feeds_pick_the_given_name_among_a_ports_names():
    ports = [_port("ids", "_to_copy"), _port("mask", "/Cast_1_output_0")]
    assert input_feeds(ports, {"mask", "ids", "labels"}, "m.xml") == [(0, "ids"), (1, "mask")]


def test_feeds_fall_back_to_position_only_when_one_port_and_one_name_are_left():
    assert input_feeds([_port("_to_copy")], {"ids"}, "m.xml") == [(0, "ids")]
    assert input_feeds([_port("a"), _port("x")], {"a", "b"}, "m.xml") == [(0, "a"), (1, "b")]
    with pytest.raises(ValueError, match=r"m.xml: no input given for the port\(s\) named p; q \(given: a, b\); "
                                         r"feed them under the spec's input names"):
        input_feeds([_port("p"), _port("q")], {"a", "b"}, "m.xml")


def test_a_port_answering_to_two_given_names_is_refused():
    with pytest.raises(ValueError, match="m.xml: input port 0 answers to a, b: give only one of them"):
        input_feeds([_port("a", "b")], {"a", "b"}, "m.xml")
