"""A rare branch on the inputs' values (``if x.abs().max() > 8:``) that no verification case takes: the
probes cannot show that a trace froze it, the tracer's warning can. The TorchScript variant is then the
scripted one (or none), the legacy ONNX trace is refused whatever made it the exporter used (the spec, or
any dynamo failure); a warning about a static size is no alarm."""

from __future__ import annotations

import importlib.util
import re
import textwrap
import warnings

import numpy as np
import pytest
import torch
import yaml

from builder.core.errors import VerificationError
from builder.pipeline import build

RARE = '''
import torch

class Rare(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l = torch.nn.Linear(16, 4)

    def forward(self, x):
        if x.abs().max() > 8:
            x = torch.clamp(x, -8, 8) / 8
        return {tail}

def build():
    return Rare().eval()
'''
BRANCH_LINE = r"model\.py:11 `if x\.abs\(\)\.max\(\) > 8:` \(Python boolean\)"

# static shapes only: the sizes the tracer warns about are the same for every input
STATIC_SIZES = '''
import torch

class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l = torch.nn.Linear(16, 4)
        self.gain = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        y = self.l(x) / float(x.shape[-1]) ** 0.5
        if x.shape[-1] > 8 and self.gain > 0:
            y = y * self.gain
        return y

def build():
    return Scaled().eval()
'''


def model_folder(tmp_path, source: str, **spec) -> tuple:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.py").write_text(source)
    data = {"name": "m", "source": {"module": "model:build"}, "outputs": [{"name": "y"}], "max_batch_size": 0,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [16]}], **spec}
    (folder / "spec.yaml").write_text(yaml.safe_dump(data))
    loader = importlib.util.spec_from_file_location("rare_branch_model", folder / "model.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return folder / "spec.yaml", module.build()


def saturated() -> np.ndarray:
    x = np.random.default_rng(0).normal(size=16).astype(np.float32)
    x[0] = 50.0  # a saturated reading: the rare branch
    return x


def run_build(spec, tmp_path, variants):
    return build(spec, tmp_path / "repo", variants=variants, benchmark_seconds=0, progress=lambda m: None).context


def test_a_rare_branch_ships_the_scripted_model_and_no_frozen_onnx(tmp_path):
    spec, eager = model_folder(tmp_path, RARE.format(tail="self.l(x)"))
    ctx = run_build(spec, tmp_path, ["torchscript", "onnx"])

    torchscript = ctx.variant("torchscript")
    assert torchscript.exporter == "torch.jit.script" and torchscript.verified is True
    stage = next(r for r in ctx.results if r.stage == "export_torchscript")
    assert stage.outputs["trace_unsafe"] is True
    assert re.search(r"shipping torch\.jit\.script: the trace froze data-dependent control flow at " + BRANCH_LINE,
                     stage.reason)
    assert any(re.search(r"^trace-unsafe: torch\.jit\.trace froze data-dependent control flow: at " + BRANCH_LINE
                         + r".*no verification case takes another path.*fix: make forward scriptable", note)
               for note in ctx.notes)
    published = torch.jit.load(str(tmp_path / "repo" / "m" / "1" / "model.pt"))
    x = torch.from_numpy(saturated())
    np.testing.assert_allclose(published(x).detach().numpy(), eager(x).detach().numpy(), rtol=1e-5, atol=1e-6)

    assert ctx.variant("onnx") is None  # the legacy trace would have answered the common branch for x
    kind, why = ctx.not_made["onnx"]
    assert kind == "failed"
    assert re.search(r"legacy: refused: the model has data-dependent control flow \(the dynamo exporter cannot guard "
                     r"on a data-dependent value\), and the legacy exporter's trace froze data-dependent control "
                     r"flow: at " + BRANCH_LINE + r".*fix: write that branch with tensor ops "
                     r"\(torch\.where\(cond, a, b\), or torch\.cond\).*or serve the torchscript variant", why)


def test_an_onnx_only_build_of_a_rare_branch_publishes_nothing_and_says_why(tmp_path):
    spec, _ = model_folder(tmp_path, RARE.format(tail="self.l(x)"))
    with pytest.raises(VerificationError, match=r"(?s)nothing was published.*export_onnx: every ONNX exporter failed: "
                                                r".*legacy: refused: the model has data-dependent control flow"):
        run_build(spec, tmp_path, ["onnx"])


def test_a_rare_branch_that_cannot_be_scripted_ships_no_trace_naming_the_line_and_the_fix(tmp_path):
    spec, _ = model_folder(tmp_path, RARE.format(tail="(lambda t: self.l(t))(x)"))  # script takes no lambda
    with pytest.raises(VerificationError, match=r"(?s)export_torchscript: no usable TorchScript export: script: "
                                                r"Lambda.*; trace: torch\.jit\.trace froze data-dependent control "
                                                r"flow: at " + BRANCH_LINE + r".*fix: make forward "
                                                r"scriptable .*torch\.where\(cond, a, b\) instead of a Python if"):
        run_build(spec, tmp_path, ["torchscript"])


def test_a_branch_the_cases_do_take_is_left_to_verification_with_the_line_as_hint(tmp_path):
    # the seeded cases straddle 2.2 (max |x| from 1.4 to 2.3): verification meets the frozen branch itself
    spec, _ = model_folder(tmp_path, RARE.format(tail="self.l(x)").replace("> 8", "> 2.2"))
    with pytest.raises(VerificationError, match=r"(?s)onnx: failed verification:.*hint: the legacy exporter's trace "
                                                r"froze data-dependent control flow: at model\.py:11 `if x\.abs\(\)"
                                                r"\.max\(\) > 2\.2:`"):
        run_build(spec, tmp_path, ["onnx"])


def test_tracer_warnings_about_static_sizes_and_weights_are_no_alarm(tmp_path):
    spec, model = model_folder(tmp_path, STATIC_SIZES, onnx={"exporter": "legacy"})
    with warnings.catch_warnings(record=True) as caught:  # the premise: the tracer does warn here
        warnings.simplefilter("always")
        torch.jit.trace(model, (torch.zeros(16),), check_trace=False, strict=False)
    assert {str(w.message).split(" might")[0] for w in caught if w.filename.endswith("model.py")} >= {
        "Converting a tensor to a Python float", "Converting a tensor to a Python boolean"}

    ctx = run_build(spec, tmp_path, ["torchscript", "onnx"])
    stage = next(r for r in ctx.results if r.stage == "export_torchscript")
    assert stage.outputs["trace_unsafe"] is False and stage.outputs["frozen"] == []
    assert ctx.variant("torchscript").exporter == "torch.jit.trace"
    assert not any("trace-unsafe" in note or "data-dependent" in note for note in ctx.notes)
    onnx = ctx.variant("onnx")
    assert onnx.exporter == "legacy" and onnx.verified is True



def test_a_legacy_only_export_of_a_rare_branch_is_refused_naming_the_line(tmp_path):
    spec, _ = model_folder(tmp_path, RARE.format(tail="self.l(x)"), onnx={"exporter": "legacy"})
    ctx = run_build(spec, tmp_path, ["torchscript", "onnx"])

    assert ctx.variant("torchscript").exporter == "torch.jit.script"
    assert ctx.variant("onnx") is None
    kind, why = ctx.not_made["onnx"]
    assert kind == "failed" and "dynamo" not in why.split("legacy: ", 1)[0]
    assert re.search(r"every ONNX exporter failed: legacy: refused: the model has data-dependent control flow "
                     r"\(onnx\.exporter: legacy, so only the legacy exporter was tried\), and the legacy exporter's "
                     r"trace froze data-dependent control flow: at " + BRANCH_LINE + r".*fix: write that branch "
                     r"with tensor ops \(torch\.where\(cond, a, b\), which a trace keeps; torch\.cond with "
                     r"onnx\.exporter: auto\)", why)


def test_a_legacy_fallback_after_any_dynamo_failure_refuses_a_rare_branch(tmp_path, monkeypatch):
    from builder.stages import export_onnx

    def broken(model, spec, path):  # a dynamo failure that says nothing about data-dependent values
        raise RuntimeError("Unsupported: an operator this exporter does not know")

    monkeypatch.setattr(export_onnx, "export_dynamo", broken)
    spec, _ = model_folder(tmp_path, RARE.format(tail="self.l(x)"))
    ctx = run_build(spec, tmp_path, ["torchscript", "onnx"])

    assert ctx.variant("onnx") is None
    why = ctx.not_made["onnx"][1]
    assert re.search(r"dynamo: Unsupported: an operator.*; legacy: refused: the model has data-dependent control "
                     r"flow, and the legacy exporter's trace froze data-dependent control flow: at " + BRANCH_LINE
                     + r".*fix: write that branch with tensor ops \(torch\.where\(cond, a, b\), or torch\.cond\) "
                     r"so the dynamo exporter takes it", why)


def watched_traces(monkeypatch) -> list:
    """The models frozen_conversions traced a second time (its watched trace), in order."""
    from builder.optimise import trace_safety

    traced, watch = [], trace_safety._input_dependent_sites

    def counted(model, args):
        traced.append(model)
        return watch(model, args)

    monkeypatch.setattr(trace_safety, "_input_dependent_sites", counted)
    return traced


def test_a_legacy_export_whose_conversions_are_sizes_and_weights_is_published(tmp_path, monkeypatch):
    traced = watched_traces(monkeypatch)
    spec, _ = model_folder(tmp_path, STATIC_SIZES, onnx={"exporter": "legacy"})
    ctx = run_build(spec, tmp_path, ["onnx"])

    onnx = ctx.variant("onnx")
    assert onnx.exporter == "legacy" and onnx.verified is True
    assert (tmp_path / "repo" / "m" / "1" / "model.onnx").is_file()
    stage = next(r for r in ctx.results if r.stage == "export_onnx")
    assert len(traced) == 1 and stage.outputs["frozen"] == []  # checked, and found harmless
    assert not any("data-dependent" in note for note in onnx.notes + ctx.notes)


def test_a_legacy_export_without_conversion_warnings_is_not_traced_again(tmp_path, monkeypatch):
    traced = watched_traces(monkeypatch)
    spec, _ = model_folder(tmp_path, RARE.format(tail="self.l(x)").replace("if x.abs().max() > 8:", "if True:"),
                           onnx={"exporter": "legacy"})
    ctx = run_build(spec, tmp_path, ["onnx"])

    assert ctx.variant("onnx").verified is True
    assert traced == [] and next(r for r in ctx.results if r.stage == "export_onnx").outputs["frozen"] == []


FORWARDS = {
    "bool of a value": ("if x.sum() > 0:\n    x = x * 2\nreturn x", True),
    "item of a value": ("return x / x.max().item()", True),
    "loop count from a value": ("for _ in range(int(x.abs().sum()) % 3 + 1):\n    x = x * 1.5\nreturn x", True),
    "tolist of a value": ("return x * x.tolist()[0][0]", True),
    "branch on a size": ("if x.shape[0] > 3:\n    x = x * 2\nreturn x", False),
    "int of a size": ("return x.view(int(x.size(0)), -1)", False),
    "branch on a weight": ("if self.w.sum() > 0:\n    x = x * self.w\nreturn x", False),
}


@pytest.mark.parametrize("name", list(FORWARDS))
def test_only_conversions_of_input_values_count_as_frozen(tmp_path, name):
    from builder.optimise.trace_safety import frozen_conversions

    body, counts = FORWARDS[name]
    path = tmp_path / "model.py"
    path.write_text("import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.w = torch.nn.Parameter(torch.ones(4))\n    def forward(self, x):\n"
                    + textwrap.indent(body, " " * 8) + "\n")
    loader = importlib.util.spec_from_file_location(f"frozen_{abs(hash(name))}", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    model, args = module.M().eval(), (torch.randn(4, 4),)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.trace(model, args, check_trace=False, strict=False)
    assert any("Converting a tensor to a Python" in str(w.message) for w in caught)  # every one warns alike
    frozen = frozen_conversions(model, args, caught)
    assert bool(frozen) is counts, frozen
    if counts:
        assert frozen[0].startswith("model.py:7 `")



@pytest.mark.parametrize("params, unseen", [(torch.float16, True), (torch.float32, False)])
def test_the_probe_judges_the_export_at_the_tolerance_verify_will_use(tmp_path, params, unseen):
    """An export 1e-3 off the reference on every case: a float16 model's rounding (verify passes it at the
    fp16 tolerance, so the probe must call its frozen branch unseen and refuse it), a float32 model's
    difference (verify fails it, so the probe leaves it to verify)."""
    from types import SimpleNamespace

    from builder.spec.model import VerifySpec
    from builder.stages.export_onnx import _unseen_by_the_cases

    linear = torch.nn.Linear(16, 4).eval()
    torch.onnx.export(linear, (torch.zeros(1, 16),), str(tmp_path / "m.onnx"), dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    x = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    exported = linear(torch.from_numpy(x)).detach().numpy()
    ctx = SimpleNamespace(model=torch.nn.Linear(2, 2).to(params),
                          spec=SimpleNamespace(outputs=[SimpleNamespace(name="y")], verify=VerifySpec(),
                                               source=SimpleNamespace(kind="module")),
                          reference=SimpleNamespace(cases=[{"id": "c", "inputs": {"x": x}}],
                                                    outputs=[{"y": exported * (1 + 1e-3)}],
                                                    output_dtypes={"y": "float32"}))
    assert _unseen_by_the_cases(ctx, tmp_path / "m.onnx") is unseen
