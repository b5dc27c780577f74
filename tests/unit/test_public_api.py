"""The public Python API (builder/api.py, exported by builder/__init__.py): real signatures and
docstrings, the model named the same way everywhere (name, then repository), typed results for
loadtest/sweep/tune, the old calling forms kept with a DeprecationWarning, errors naming parameters,
and ``serving_context`` starting and stopping a server."""

from __future__ import annotations

import inspect
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import pytest

import builder
from builder.core.errors import UserInputError

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ("build", "validate", "check", "select", "rollback", "serve", "serving_context", "loadtest", "sweep", "tune",
             "install_backends")
#: parameters each must name (beyond the first two)
NAMED = {
    "build": ("spec", "repository", "variants", "target", "benchmark_seconds", "progress", "signing_key"),
    "validate": ("name", "repository", "version", "public_key", "triton_release", "max_regression"),
    "check": ("name", "repository", "url", "grpc_url", "protocol", "version", "timeout"),
    "select": ("name", "repository", "seconds", "dry_run", "signing_key", "public_key", "progress"),
    "rollback": ("name", "repository", "to", "signing_key", "public_key", "progress"),
    "serve": ("repository", "load_models", "http_port", "grpc_port", "metrics_port", "public_key"),
    "serving_context": ("repository", "load_models", "http_port", "grpc_port", "metrics_port", "log_path"),
    "loadtest": ("name", "repository", "url", "protocol", "users", "run_time_s", "slo_p99_ms", "out_dir"),
    "sweep": ("name", "repository", "url", "protocol", "max_concurrency", "levels", "window_s", "engine"),
    "tune": ("name", "repository", "p99_budget_ms", "url", "protocol", "write", "publish", "engine"),
    "install_backends": ("backends", "force", "progress"),
}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_function_has_its_real_parameters_and_a_docstring(function):
    fn = getattr(builder, function)
    assert function in builder.__all__
    parameters = inspect.signature(fn).parameters
    kinds = {p.kind for p in parameters.values()}
    assert inspect.Parameter.VAR_POSITIONAL not in kinds and inspect.Parameter.VAR_KEYWORD not in kinds
    assert list(parameters)[:len(NAMED[function][:2])] == list(NAMED[function][:2])
    assert set(NAMED[function]) <= set(parameters), set(NAMED[function]) - set(parameters)
    assert fn.__doc__ and len(fn.__doc__.split()) > 20
    assert inspect.signature(fn).return_annotation is not inspect.Signature.empty


def test_a_model_is_named_first_then_its_repository_with_the_same_default():
    for function in ("validate", "check", "select", "rollback", "loadtest", "sweep", "tune"):
        first, second = list(inspect.signature(getattr(builder, function)).parameters.values())[:2]
        assert (first.name, second.name, second.default) == ("name", "repository", "model_repository"), function
    assert inspect.signature(builder.serve).parameters["repository"].default == "model_repository"


def test_importing_builder_stays_light():
    heavy = ("numpy", "torch", "onnx", "builder.pipeline")
    code = f"import builder, sys; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def _model_folder(repository: Path, name: str = "m") -> Path:
    (repository / name).mkdir(parents=True)
    return repository


def test_select_in_the_old_order_warns_and_still_selects(monkeypatch, tmp_path):
    import builder.api as api  # the API binds the library functions it calls

    calls = []
    monkeypatch.setattr(api, "select_for_host", lambda repository, name, **kw: calls.append((repository, name)))
    repo = _model_folder(tmp_path / "repo")
    with pytest.warns(DeprecationWarning, match=r"builder.select\(repository, name\) is deprecated"):
        builder.select(repo, "m")  # the old order: a repository path, then the name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        builder.select("m", repo)
        builder.select("m", str(repo))
    assert calls == [(repo, "m"), (repo, "m"), (str(repo), "m")]


def test_the_old_order_is_told_apart_by_the_folders_too(monkeypatch, tmp_path):
    import builder.api as api  # the API binds the library functions it calls

    calls = []
    monkeypatch.setattr(api, "select_for_host", lambda repository, name, **kw: calls.append((repository, name)))
    monkeypatch.chdir(tmp_path)
    _model_folder(tmp_path / "repo")
    with pytest.warns(DeprecationWarning):
        builder.select("repo", "m")  # two plain names: only repo/m is a model folder
    assert calls == [("repo", "m")]


def test_validate_takes_a_name_and_repository_and_still_a_model_path(monkeypatch, tmp_path):
    import builder.api as api  # the API binds the library functions it calls

    calls = []
    monkeypatch.setattr(api, "validate_model", lambda folder, version=None, **kw: calls.append((Path(folder),
                                                                                                     version)))
    repo = _model_folder(tmp_path / "repo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        builder.validate("m", repo, version=2)
    with pytest.warns(DeprecationWarning, match=r"builder.validate\(model_path\) is deprecated"):
        builder.validate(str(repo / "m"))
    with pytest.warns(DeprecationWarning, match=r"model_path, version"):
        builder.validate(str(repo / "m"), 3)
    assert calls == [(repo / "m", 2), (repo / "m", None), (repo / "m", 3)]


def test_check_forwards_name_and_repository(monkeypatch, tmp_path):
    import builder.api as api  # the API binds the library functions it calls

    calls = []
    monkeypatch.setattr(api, "check_served_at", lambda name, repository, **kw: calls.append((name, repository, kw)))
    builder.check("m", tmp_path, url="127.0.0.1:9000", protocol="grpc")
    builder.check("m", repository=tmp_path)  # the old keyword form
    assert [c[:2] for c in calls] == [("m", tmp_path)] * 2
    assert calls[0][2]["url"] == "127.0.0.1:9000" and calls[0][2]["protocol"] == "grpc"


@pytest.mark.parametrize("call, message", [
    (lambda: builder.check("m", protocol="udp"), "protocol='udp': use http, grpc or both"),
    (lambda: builder.check("m", url="nohost"), "url='nohost': use HOST:PORT"),
    (lambda: builder.loadtest("m", protocol="both"), "protocol='both': use http or grpc"),
    (lambda: builder.select("m", seconds=0), "seconds=0: "),
    (lambda: builder.sweep("m", "/no/such/folder"), "repository='/no/such/folder': not a folder"),
    (lambda: builder.tune("m", "s3://bucket/repo", p99_budget_ms=10), "repository='s3://bucket/repo': give the local"),
])
def test_errors_the_api_raises_name_its_parameters(call, message):
    with pytest.raises(UserInputError) as caught:
        call()
    assert message in str(caught.value) and "--" not in str(caught.value).split(":")[0]


SUMMARY = {"model": "m", "url": "127.0.0.1:8000", "protocol": "http", "requests": 900, "failures": 0, "rps": 90.5,
           "p50_ms": 4.0, "p95_ms": 8.0, "p99_ms": 9.5, "slo": {"met": False, "broken": ["p99 9.5 ms > 5 ms"]},
           "exit_code": 1, "timed_out": False, "files": {"summary": "runs/x/summary.json"}, "client": {}, "server": {}}


def test_loadtest_returns_a_typed_result_keeping_the_summary(monkeypatch, tmp_path):
    import builder.api as api  # the API binds the library functions it calls

    seen = {}

    def fake(model, url, protocol, users, run_time_s, out_dir, payload, timeout_s, **kw):
        seen.update(model=model, url=url, out_dir=out_dir, repository=kw["repository"])
        return dict(SUMMARY)

    monkeypatch.setattr(api, "run_loadtest", fake)
    monkeypatch.chdir(tmp_path)  # no ./model_repository: the payload is generated, as the CLI's default
    result = builder.loadtest("m", users=4, run_time_s=3)
    assert isinstance(result, builder.LoadTestResult)
    assert (result.requests, result.rps, result.p99_ms, result.slo_met, result.ok) == (900, 90.5, 9.5, False, False)
    assert result.slo_broken == ["p99 9.5 ms > 5 ms"] and result.raw == SUMMARY
    assert seen == {"model": "m", "url": "127.0.0.1:8000", "out_dir": Path("runs/loadtest/m"), "repository": None}


def test_sweep_and_tune_return_typed_results(monkeypatch, tmp_path):
    import builder.api as api  # the API binds the library functions it calls

    rows = [{"concurrency": 1, "throughput_rps": 100.0, "failures": 0},
            {"concurrency": 2, "throughput_rps": 180.0, "failures": 0},
            {"concurrency": 4, "throughput_rps": 250.0, "failures": 3}]
    sweep_dict = {"model": "m", "url": "127.0.0.1:8001", "protocol": "grpc", "engine": "python", "client": "c",
                  "levels": rows, "files": {"csv": "x.csv"}}
    monkeypatch.setattr(api, "run_sweep", lambda *a, **kw: sweep_dict)
    result = builder.sweep("m", None, levels=[1, 2, 4])
    assert isinstance(result, builder.SweepResult) and result.best["concurrency"] == 2 and not result.ok
    assert result.raw is sweep_dict and result.engine == "python"

    record = {"model": "m", "p99_budget_ms": 10, "winner": {"instances": 2}, "ratios": {"vs_default": 1.4},
              "summary": "1.4 x", "table": ["a", "b"], "written": False, "exit_code": 0}
    called = {}
    monkeypatch.setattr(api, "run_tune", lambda model, repository, url, **kw: called.update(kw, url=url) or record)
    tuned = builder.tune("m", _model_folder(tmp_path / "repo"), p99_budget_ms=10)
    assert isinstance(tuned, builder.TuneResult) and tuned.ok and tuned.winner == {"instances": 2}
    assert tuned.ratios == {"vs_default": 1.4} and tuned.table == ["a", "b"] and tuned.raw is record
    assert called["url"] == "127.0.0.1:8001" and "delays" not in called  # tune's own defaults


@pytest.mark.slow
def test_serving_context_starts_a_server_for_the_block_and_stops_it(tmp_path):
    repo = tmp_path / "model_repository"
    result = builder.build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0,
                           progress=lambda m: None)
    name = result.context.spec.name
    with builder.serving_context(repo, load_models=[name]) as server:
        assert server.is_running() and name in server.models
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{name}/ready", timeout=10) as answer:
            assert answer.status == 200
        report = builder.check(name, repo, url=server.http_url, grpc_url=server.grpc_url)
        assert report.ok, report.lines()
    assert not server.is_running() and server.stop_failure is None
    assert builder.validate(name, repo, regression_seconds=0).ok
