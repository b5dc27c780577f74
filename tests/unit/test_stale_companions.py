"""A build next to the ``<name>__<variant>`` companions of an earlier ``--publish-variants`` build that it
does not replace: they go on serving the earlier build's model, so the build says so (it removes nothing)."""

from __future__ import annotations

import pytest
import yaml

from builder.pipeline import build

pytestmark = pytest.mark.slow(reason="each test builds a model twice")

MODEL = '''
import torch
def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
'''


def _spec(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    spec = {"name": "m", "source": {"module": "model:build"}, "max_batch_size": 4,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "spec.yaml"


def test_a_companion_an_earlier_build_left_is_named_and_kept(tmp_path):
    spec, repo = _spec(tmp_path), tmp_path / "repo"
    build(spec, repo, variants=["onnx", "torchscript"], publish_variants=True, benchmark_seconds=0,
          progress=lambda m: None)
    companion = next(p for p in repo.iterdir() if p.name.startswith("m__"))
    said: list[str] = []
    result = build(spec, repo, variants=["onnx"], benchmark_seconds=0, progress=said.append)

    warning = (f"warning: {companion.name} (version 1) is from an earlier build of m; this build does not replace "
               f"it, so it goes on serving that build's model beside m: remove {companion} if it should not")
    assert warning in said
    assert warning in yaml.safe_load((repo / "m" / "2" / "metadata.yaml").read_text())["notes"]
    assert (companion / "1").is_dir()  # said, not removed
    assert result.context.published[0]["version"] == 2


def test_companions_this_build_replaces_are_not_named(tmp_path):
    spec, repo = _spec(tmp_path), tmp_path / "repo"
    for _ in range(2):
        said: list[str] = []
        build(spec, repo, variants=["onnx", "torchscript"], publish_variants=True, benchmark_seconds=0,
              progress=said.append)
        assert not [line for line in said if "earlier build" in line], said
