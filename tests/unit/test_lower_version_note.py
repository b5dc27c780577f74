"""A build whose spec names a version below one already published: the version is written, the config Triton
serves the higher one with is kept, and the build says so (a latest policy goes on serving the higher one)."""

from __future__ import annotations

import yaml

from builder.pipeline import build

MODEL = "import torch\ndef build():\n    torch.manual_seed(0)\n    return torch.nn.Linear(4, 3).eval()\n"


def test_a_version_published_below_the_latest_says_what_is_served(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    spec = {"name": "m", "source": {"module": "model:build"}, "max_batch_size": 4,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}]}
    said: list[str] = []
    served = None
    for version, variant in ((9, "onnx"), (5, "torchscript")):
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump({**spec, "version": version}))
        said.clear()
        build(tmp_path / "spec.yaml", tmp_path / "repo", variants=[variant], benchmark_seconds=0, progress=said.append)
        served = served or (tmp_path / "repo" / "m" / "config.pbtxt").read_text()
    warning = next(line for line in said if line.startswith("warning: version 5 of 'm' was published below version 9"))
    assert "a latest version_policy goes on serving 9, not 5" in warning
    assert (tmp_path / "repo" / "m" / "config.pbtxt").read_text() == served  # version 9's config, kept
    assert (tmp_path / "repo" / "m" / "5" / "model.pt").is_file()
