"""benchmarks/vs_model_analyzer.py: a config two tools both chose is measured once and reported for both.
Three copies of one config measured side by side differed by the host's noise alone, and one of them then
read 'over the budget' (0 infer/s) - a verdict about noise, not about the tools."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BUILT = """name: "digits_cnn"
backend: "python"
max_batch_size: 64
input [ { name: "image" data_type: TYPE_FP32 dims: [ 1, 8, 8 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
"""


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("vs_model_analyzer", ROOT / "benchmarks" / "vs_model_analyzer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name / "config.pbtxt"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_the_same_config_under_another_name_and_layout_is_one_config(script, tmp_path):
    reordered = BUILT.replace('name: "digits_cnn"', 'name: "digits_cnn_config_default"')
    reordered = "\n".join(reversed(reordered.strip().splitlines())) + "\n"  # field order is not meaning
    other = BUILT.replace("count: 1", "count: 2")
    paths = {"default": _write(tmp_path, "a", BUILT), "model_analyzer": _write(tmp_path, "b", reordered),
             "tune": _write(tmp_path, "c", other)}
    assert script.same_configs(paths) == {"default": "default", "model_analyzer": "default", "tune": "tune"}
    paths["tune"] = _write(tmp_path, "d", BUILT)
    assert script.same_configs(paths)["tune"] == "default"


def test_a_config_that_does_not_parse_is_named(script, tmp_path):
    paths = {"default": _write(tmp_path, "a", BUILT), "tune": _write(tmp_path, "b", "max_batch_size: [oops\n")}
    with pytest.raises(Exception, match=r"b/config.pbtxt does not parse with Triton's schema"):
        script.same_configs(paths)


def test_the_table_reports_a_shared_config_with_the_same_figures(script, capsys):
    class Args:
        example, rounds = "digits", 3

    measured = {8: [(6189.0, 2.3)] * 3, 16: [(7759.0, 3.7)] * 3}
    figures = {"default": measured, "model_analyzer": measured, "tune": {8: [(6500.0, 2.2)] * 3, 16: [(8000.0, 3.5)] * 3}}
    ma_best = {"config": "digits_cnn_config_default", "throughput": 6078.0, "p99_ms": 2.3, "concurrency": "8"}
    script.print_table(Args, figures, 200.0, 61.0, 96894.0, ma_best,
                       {"default": "default", "model_analyzer": "default", "tune": "tune"})
    out = capsys.readouterr().out
    assert "model_analyzer (=default) |" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["same_config"] == {"model_analyzer": "default"}
    assert summary["model_analyzer"] == [6189.0, 2.3, 8]
    assert summary["tune_vs_model_analyzer_throughput"] == round(6500 / 6189, 3)
