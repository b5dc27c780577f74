"""The CLI veneer: global flags, quiet progress, help text on every option, every verb registered."""

from __future__ import annotations

import argparse
import io

import pytest

from builder.cli import make_parser
from builder.core.progress import Reporter, bar, report
from tests.conftest import EXAMPLES, run_cli

VERBS = {"init", "build", "validate", "select", "clean", "releases", "run", "serve", "check", "loadtest", "sweep", "tune", "publish", "replicas", "k8s",
         "register", "rollback", "install-backends"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_verb_is_registered_and_every_option_explains_itself():
    verbs = _subparsers(make_parser())
    assert set(verbs) == VERBS
    undocumented = [f"{verb} {'/'.join(a.option_strings)}" for verb, p in verbs.items() for a in p._actions
                    if a.option_strings and not a.help and a.dest != "help"]
    assert undocumented == []
    assert all({"-q", "-v"} <= set(p._option_string_actions) for p in verbs.values())


def test_version_flag():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("triton-builder ")


@pytest.mark.slow(reason="runs a real build through the CLI")
def test_quiet_build_prints_results_but_no_progress(tmp_path):
    args = ("build", str(EXAMPLES / "digits" / "spec.yaml"), "--variants", "onnx", "--benchmark-seconds", "0")
    loud = run_cli(*args, "--repository", str(tmp_path / "loud"))
    quiet = run_cli(*args, "--repository", str(tmp_path / "quiet"), "-q")
    assert loud.returncode == 0 and quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "[1/" in loud.stdout and "building digits_cnn" in loud.stdout
    assert "[1/" not in quiet.stdout and "building digits_cnn" not in quiet.stdout
    assert "published digits_cnn version 1" in quiet.stdout and "variant" in quiet.stdout  # the table stays


def test_reporter_lines_detail_and_bars_off_a_terminal():
    out = io.StringIO()
    reporter = Reporter(stream=out)
    report(reporter, "a line")
    report(reporter, "hidden detail", detail=True)
    with bar(reporter, "steps", total=2) as advance:  # not a TTY: no bar, advance is a no-op
        advance()
    assert out.getvalue() == "a line\n"
    verbose = Reporter(stream=out, verbose=True)
    report(verbose, "shown detail", detail=True)
    assert out.getvalue().endswith("shown detail\n")
    silent = Reporter(stream=out, quiet=True)
    silent("nothing")
    assert "nothing" not in out.getvalue()
    seen = []
    report(seen.append, "to any callable")
    report(None, "to nobody")
    with bar(seen.append, "no bar for a plain callable", total=1) as advance:
        advance()
    assert seen == ["to any callable"]


def test_unknown_verb_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        make_parser().parse_args(["frobnicate"])
    assert info.value.code == 2


def test_validate_json_for_ci_pipelines(built_repository, tmp_path):
    import json
    import shutil

    proc = run_cli("validate", str(built_repository / "digits_cnn"), "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # stdout is exactly one JSON object
    assert report["ok"] is True and report["model"] == "digits_cnn" and report["failures"] == []
    assert report["versions"][0]["version"] == 1 and report["lines"]
    # a tampered copy: exit 1, and the JSON names the file
    copy = tmp_path / "repo"
    shutil.copytree(built_repository / "digits_cnn", copy / "digits_cnn")
    with open(copy / "digits_cnn" / "1" / "model.onnx", "ab") as handle:
        handle.write(b"tampered")
    bad = run_cli("validate", str(copy / "digits_cnn"), "--json")
    assert bad.returncode == 1
    assert "model.onnx" in json.dumps(json.loads(bad.stdout)["versions"])


def test_serve_takes_tritons_default_ports_or_says_why_not(monkeypatch):
    import socket

    from builder.cli import serving
    from builder.core.processes import free_ports

    args = make_parser().parse_args(["serve"])
    defaults = dict(zip(("http", "grpc", "metrics"), free_ports("127.0.0.1", 3)))
    monkeypatch.setattr(serving, "DEFAULT_PORTS", defaults)  # stand-ins for 8000-8002, free right now
    lines = []
    assert serving._ports(args, lines.append) == defaults and lines == []
    with socket.socket() as holder:  # one of them taken: free ports, and the user is told
        holder.bind(("127.0.0.1", defaults["grpc"]))
        holder.listen()
        assert serving._ports(args, lines.append) == {"http": None, "grpc": None, "metrics": None}
    assert len(lines) == 1 and f"port(s) {defaults['grpc']} in use" in lines[0] and "--url" in lines[0]
    explicit = make_parser().parse_args(["serve", "--http-port", "18000", "--grpc-port", "18001",
                                         "--metrics-port", "18002"])
    assert serving._ports(explicit, lines.append) == {"http": 18000, "grpc": 18001, "metrics": 18002}


def test_select_measures_here_and_dry_run_publishes_nothing(built_repository, tmp_path):
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(built_repository / "digits_cnn", copy / "digits_cnn")
    proc = run_cli("select", "digits_cnn", "--repository", str(copy), "--seconds", "0.3", "--dry-run", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "digits_cnn/1:" in proc.stdout and "inf/s" in proc.stdout  # really measured here
    assert not (copy / "digits_cnn" / "2").exists()
    proc = run_cli("select", "nope", "--repository", str(copy), "-q")
    assert proc.returncode == 2 and "model 'nope' is not in" in proc.stderr
    assert "(its models: digits_cnn)" in proc.stderr


@pytest.mark.parametrize("argv, option", [
    (["sweep", "m", "--window", "nan"], "--window"),
    (["tune", "m", "--p99-budget-ms", "nan"], "--p99-budget-ms"),
    (["tune", "m", "--p99-budget-ms", "50", "--seconds-per-candidate", "inf"], "--seconds-per-candidate"),
    (["loadtest", "m", "--slo-p99-ms", "nan"], "--slo-p99-ms"),
])
def test_nan_and_inf_are_refused_where_a_number_is_asked(argv, option, capsys):
    """nan passed every '<= 0' check: a p99 SLO of nan was 'met', a budget of nan searched for nothing."""
    with pytest.raises(SystemExit) as exited:
        make_parser().parse_args(argv)
    assert exited.value.code == 2
    assert f"argument {option}: '{argv[argv.index(option) + 1]}' is not a finite number" in capsys.readouterr().err
    assert not [a for p in _subparsers(make_parser()).values() for a in p._actions if a.type is float]


def test_sweep_window_errors_name_the_options_that_exist(tmp_path):
    from builder.core.errors import UserInputError
    from builder.tuning.sweep import run_sweep

    with pytest.raises(UserInputError, match=r"^--window 0: must be > 0 s$"):
        run_sweep("m", "127.0.0.1:1", "grpc", 2, tmp_path, window_s=0)
    with pytest.raises(UserInputError, match=r"^--seconds-per-level 1: must allow three windows of --window 0.5 s "
                                             r"\(stability needs 3\): raise it or lower --window$"):
        run_sweep("m", "127.0.0.1:1", "grpc", 2, tmp_path, window_s=0.5, max_seconds_per_level=1)


class _Index:
    """What check's readiness probe reads from a server: readiness per version and the repository index."""

    def __init__(self, entries):
        self.entries = entries

    def model_ready(self, name, version):
        return any(e["name"] == name and e["version"] == str(version) and e["state"] == "READY" for e in self.entries)

    def repository_index(self):
        return self.entries


def test_check_of_an_unserved_version_says_its_own_state_and_which_version_is_served():
    from builder.core.errors import ServerError
    from builder.serving.check import _require_ready

    index = _Index([{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
                    {"name": "m", "version": "2", "state": "READY"}])
    with pytest.raises(ServerError, match=r"model 'm' version 1 is not ready on u \(state UNAVAILABLE: unloaded\); "
                                          r"the server serves version\(s\) 2 of it: check one of those \(--version\)"):
        _require_ready(index, "m", 1, "u")
    with pytest.raises(ServerError, match=r"version 3 is not ready on u; the server serves version\(s\) 2 of it"):
        _require_ready(index, "m", 3, "u")
    with pytest.raises(ServerError, match=r"model 'x' version 1 is not ready on u; load it \(triton-builder serve"):
        _require_ready(index, "x", 1, "u")


def test_a_sweep_whose_server_stopped_answering_is_a_server_error():
    from builder.cli.tuning import _raise_if_unreachable
    from builder.core.errors import ServerError
    from builder.core.processes import free_port

    args = argparse.Namespace(url=f"127.0.0.1:{free_port()}", protocol="http", name="m")
    with pytest.raises(ServerError, match=r"every request of the sweep failed and the server no longer answers: "):
        _raise_if_unreachable(args)


def test_serve_refuses_a_model_folder_or_an_empty_repository(tmp_path):
    from builder.core.errors import UserInputError
    from builder.serving.serve import serve_forever

    model = tmp_path / "repo" / "digits_cnn"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "digits_cnn"\n')
    with pytest.raises(UserInputError, match=rf"--repository {model}: this is a model folder \(it holds config\.pbtxt\); "
                                             rf"pass the repository above it: --repository {model.parent}$"):
        serve_forever(model)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserInputError, match=rf"--repository {empty}: no models in it; build one into it first"):
        serve_forever(empty)


def test_run_without_a_spec_outside_the_checkout_says_where_the_default_lives(tmp_path, monkeypatch, capsys):
    from builder import cli

    monkeypatch.chdir(tmp_path)  # an installed triton-builder, run elsewhere: no examples/ here
    assert cli.main(["run", "--repository", str(tmp_path / "repo")]) == 2
    assert ("no SPEC given, and the default examples/digits/spec.yaml is not here (it is in the project's checkout)"
            in capsys.readouterr().err)
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("verb", [["loadtest"], ["sweep"], ["tune", "--p99-budget-ms", "50"]])
def test_load_verbs_name_an_s3_repository_as_given_and_say_what_to_pass(verb, capsys):
    from builder import cli

    assert cli.main([*verb, "m", "--repository", "s3://models/prod"]) == 2
    err = capsys.readouterr().err
    assert "--repository s3://models/prod: loadtest, sweep and tune read the repository from a local folder" in err
    assert "s3:/models" not in err
