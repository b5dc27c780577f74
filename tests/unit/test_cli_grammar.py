"""The one CLI grammar (docs/reference/grammar.md), checked on every verb by walking make_parser(): -q/-v
everywhere, -o on every verb with a result, the shared duration type on every duration option, NAME with the
same --repository default wherever a model is named; and the deprecated spellings still work, with a note."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from builder.api import DEFAULT_REPOSITORY
from builder.cli import make_parser
from builder.cli.arguments import duration
from tests.conftest import ROOT

REPORTING = {"init", "build", "validate", "select", "rollback", "clean", "releases", "check", "loadtest", "sweep", "tune",
             "register", "publish", "k8s", "install-backends"}
RUN_UNTIL_STOPPED = {"serve", "replicas", "run"}  # no result document: they serve, or run the main job
MODEL_NAMING = {"validate", "select", "rollback", "check", "loadtest", "sweep", "tune", "register", "publish", "k8s"}
REPOSITORY_ONLY = {"build", "serve", "replicas", "clean"}
DURATION = re.compile(r"^--(.*-seconds|seconds(-per-.*)?|run-time|window|timeout|.*-s)$")


def _verbs() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return parser._option_string_actions.get(flag)


def test_every_verb_is_classified_and_in_the_grammar_page():
    verbs = set(_verbs())
    assert verbs == REPORTING | RUN_UNTIL_STOPPED
    page = (ROOT / "docs" / "reference" / "grammar.md").read_text()
    assert [verb for verb in sorted(verbs) if f"| `{verb}` |" not in page] == []


def test_every_verb_has_quiet_and_verbose():
    for verb, parser in _verbs().items():
        for flag in ("-q", "--quiet", "-v", "--verbose"):
            assert _option(parser, flag) is not None, f"{verb} {flag}"


def test_every_reporting_verb_has_output_with_json_as_its_old_spelling():
    for verb, parser in _verbs().items():
        output = _option(parser, "-o")
        if verb not in REPORTING:
            assert output is None, f"{verb} has no result document"
            continue
        assert output is not None and output is _option(parser, "--output"), verb
        assert tuple(output.choices) == ("table", "json") and output.default == "table", verb
        assert _option(parser, "--json").dest == "output", verb


def test_every_duration_option_takes_the_shared_type():
    seen = []
    for verb, parser in _verbs().items():
        for action in parser._actions:
            flags = [f for f in action.option_strings if f.startswith("--")]
            if any(DURATION.match(f) for f in flags):
                seen.append(f"{verb} {flags[0]}")
                assert action.type is duration, f"{verb} {flags[0]} is a duration: type=duration"
            if action.type is duration:
                assert any(DURATION.match(f) for f in flags), f"{verb} {flags}: name a duration as one"
    assert {"loadtest --run-time", "loadtest --timeout", "sweep --window", "tune --seconds-per-candidate",
            "build --benchmark-seconds", "select --seconds", "replicas --watch-seconds",
            "k8s --poll-seconds", "run --load-seconds", "sweep --seconds-per-level"} <= set(seen)


@pytest.mark.parametrize("text, seconds", [("30", 30.0), ("0.5", 0.5), ("90s", 90.0), ("2m", 120.0),
                                            ("1h", 3600.0), ("1.5m", 90.0)])
def test_a_duration_is_seconds_or_a_number_with_a_unit(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text, says", [("nan", "is not a finite number"), ("-1", "is not a duration"),
                                        ("2 days", "is not a duration")])
def test_a_bad_duration_is_a_usage_error_naming_the_option(text, says, capsys):
    with pytest.raises(SystemExit) as exited:
        make_parser().parse_args(["sweep", "m", "--seconds-per-level", text])
    assert exited.value.code == 2
    assert f"argument --seconds-per-level: '{text}' {says}" in capsys.readouterr().err


def test_every_model_naming_verb_takes_name_and_the_same_repository_default():
    for verb, parser in _verbs().items():
        repository = _option(parser, "--repository")
        if verb in MODEL_NAMING:
            names = [a for a in parser._actions if not a.option_strings and a.dest == "name"]
            assert names and names[0].metavar == "NAME", f"{verb}: a positional NAME"
        if verb in MODEL_NAMING | REPOSITORY_ONLY:
            assert repository is not None and repository.default == DEFAULT_REPOSITORY, verb
        for flag in ("--model", "--version", "--repository-url", "--target"):
            old = _option(parser, flag)
            if old is not None and not (verb == "build" and flag == "--target"):
                assert old.help.startswith("deprecated: use "), f"{verb} {flag}: one meaning, the old one deprecated"
    assert _option(_verbs()["run"], "--repository").default == "runs/model_repository"  # its scratch, emptied


def test_one_default_repository_and_one_set_of_ports():
    from builder import api
    from builder.cli import serving, tuning

    assert serving.DEFAULT_PORTS is api.DEFAULT_PORTS and tuning.DEFAULT_PORTS is api.DEFAULT_PORTS
    defined = [p for p in (ROOT / "builder").rglob("*.py")
               if re.search(r"^DEFAULT_(REPOSITORY|PORTS) = ", p.read_text(), re.M)]
    assert [str(p.relative_to(ROOT)) for p in defined] == ["builder/api.py"]


@pytest.mark.parametrize("argv, dest, value, old, new", [
    (["validate", "m", "--version", "2"], "model_version", 2, "--version", "--model-version"),
    (["check", "m", "--version", "3"], "model_version", 3, "--version", "--model-version"),
    (["register", "m", "--version", "1"], "model_version", 1, "--version", "--model-version"),
    (["publish", "--to", "s3://b/p", "--version", "4"], "model_version", 4, "--version", "--model-version"),
    (["check", "m", "--json"], "output", "json", "--json", "-o json"),
    (["validate", "m", "--json"], "output", "json", "--json", "-o json"),
    (["publish", "--to", "s3://b/p", "--model", "a", "--model", "b"], "model", ["a", "b"], "--model",
     "a positional NAME"),
    (["k8s", "--out", "o", "--model", "m"], "model", "m", "--model", "a positional NAME"),
    (["k8s", "--out", "o", "--repository-url", "s3://b/p"], "repository", "s3://b/p", "--repository-url",
     "--repository"),
    (["k8s", "--out", "o", "--target", "4"], "hpa_target", 4.0, "--target", "--hpa-target"),
])
def test_deprecated_options_still_work_and_say_what_replaces_them(argv, dest, value, old, new, capsys):
    args = make_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert f"note: {old} is deprecated, use {new}" in capsys.readouterr().err


def test_new_spellings_print_no_note(capsys):
    parser = make_parser()
    args = parser.parse_args(["k8s", "m", "--repository", "s3://b/p", "--out", "o", "--hpa-target", "4", "-o",
                              "json"])
    assert (args.name, args.repository, args.hpa_target, args.output) == ("m", "s3://b/p", 4.0, "json")
    args = parser.parse_args(["publish", "a", "b", "--to", "s3://b/p", "--model-version", "2"])
    assert (args.name, args.model_version) == (["a", "b"], 2)
    assert parser.parse_args(["build", "s.yaml", "--target", "gpu"]).target == "gpu"  # build's: the deploy target
    assert capsys.readouterr().err == ""


def test_the_old_model_folder_positional_works_with_a_note(tmp_path, capsys):
    from builder.cli.arguments import model_folder_form
    from builder.core.errors import UserInputError

    assert model_folder_form("m", "repo", "validate") == ("m", "repo")
    assert capsys.readouterr().err == ""
    assert model_folder_form(f"{tmp_path}/m", DEFAULT_REPOSITORY, "validate") == ("m", str(tmp_path))
    err = capsys.readouterr().err
    assert f"note: validate DIR/NAME is deprecated, use validate NAME --repository DIR (validate m --repository " \
           f"{tmp_path})" in err
    assert model_folder_form(f"{tmp_path}/m/", str(tmp_path), "register") == ("m", str(tmp_path))
    with pytest.raises(UserInputError, match="name the model once"):
        model_folder_form(f"{tmp_path}/m", "elsewhere", "validate")


def _model(repository, name="m", versions=(1,)):
    folder = repository / name
    for version in versions:
        (folder / str(version)).mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n')
    return folder


def test_validate_takes_name_and_repository_and_the_old_folder_form(tmp_path, monkeypatch, capsys):
    from builder import cli
    from builder.cli import build as build_verbs  # the verb's module binds the library function it calls

    seen = []

    class Report:
        model, ok = "m", True

        def lines(self):
            return ["  version 1: ok"]

    monkeypatch.setattr(build_verbs, "validate_model", lambda folder, version, **kw: seen.append(
        (str(folder), version)) or Report())
    _model(tmp_path / "repo")
    assert cli.main(["validate", "m", "--repository", str(tmp_path / "repo"), "--model-version", "1"]) == 0
    out, err = capsys.readouterr()
    assert seen[-1] == (str(tmp_path / "repo" / "m"), 1) and out.startswith("m: OK") and err == ""
    assert cli.main(["validate", str(tmp_path / "repo" / "m"), "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert seen[-1] == (str(tmp_path / "repo" / "m"), None)
    assert json.loads(out)["ok"] is True and "validate DIR/NAME is deprecated" in err


def test_select_is_a_dry_run_unless_write_and_says_so_when_no_flag_was_given(monkeypatch, capsys):
    from builder import cli
    from builder.cli import build as build_verbs  # the verb's module binds the library function it calls

    calls = []

    class Report:
        ok = True

        def lines(self):
            return ["would publish"]

    monkeypatch.setattr(build_verbs, "default_measure", lambda seconds: None)
    monkeypatch.setattr(build_verbs, "select_for_host", lambda repository, name, **kw: calls.append(kw["dry_run"])
                        or Report())
    assert cli.main(["select", "m"]) == 0
    assert calls[-1] is True and "select no longer publishes by default" in capsys.readouterr().err
    assert cli.main(["select", "m", "--dry-run"]) == 0
    assert calls[-1] is True and capsys.readouterr().err == ""
    assert cli.main(["select", "m", "--write", "--seconds", "1m"]) == 0
    assert calls[-1] is False and capsys.readouterr().err == ""


def test_json_output_is_one_document_on_stdout_and_progress_goes_to_stderr(monkeypatch, capsys):
    from builder import cli
    from builder.cli import build as build_verbs  # the verb's module binds the library function it calls

    class Report:
        ok, model = True, "m"

        def lines(self):
            return ["the why"]

    def select(repository, name, progress, **kw):
        progress("measuring m ...")  # a progress line
        print("a stray print")
        return Report()

    monkeypatch.setattr(build_verbs, "default_measure", lambda seconds: None)
    monkeypatch.setattr(build_verbs, "select_for_host", select)
    assert cli.main(["select", "m", "--dry-run", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)  # the whole of stdout: one document
    assert document == {"result": document["result"], "ok": True, "lines": ["the why"]}
    assert "measuring m" in err and "a stray print" in err and "measuring" not in out


def test_releases_json_lists_every_release():
    from tests.conftest import run_cli

    proc = run_cli("releases", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["default"] in data["releases"] and data["lines"]


def test_quiet_removes_progress_lines(monkeypatch, capsys):
    """-q: results stay, progress lines go (select, and publish, which ignored -q before)."""
    from builder import cli
    from builder.cli import build as build_verbs, scaleout as scaleout_verbs

    class Report:
        ok = True

        def lines(self):
            return ["the result"]

    def select(repository, name, progress, **kw):
        progress("measuring m ...")
        return Report()

    class Published:
        def line(self):
            return "m version 1: published"

    def publish(repository, to, models=None, version=None, progress=None):
        progress("uploading m version 1 ...")
        return [Published()]

    monkeypatch.setattr(build_verbs, "default_measure", lambda seconds: None)
    monkeypatch.setattr(build_verbs, "select_for_host", select)
    monkeypatch.setattr(scaleout_verbs, "publish_repository", publish)
    for argv, progress, result in ((["select", "m", "--dry-run"], "measuring m", "the result"),
                                   (["publish", "m", "--to", "s3://b/p"], "uploading m", "m version 1: published")):
        assert cli.main(argv) == 0
        loud = capsys.readouterr().out
        assert cli.main([*argv, "-q"]) == 0
        quiet = capsys.readouterr().out
        assert progress in loud and result in loud
        assert progress not in quiet and result in quiet


def test_quiet_serve_keeps_the_addresses_only():
    from builder.cli.serving import quiet_announce
    from builder.core.progress import Reporter

    printed = []
    import builtins

    original = builtins.print
    try:
        builtins.print = lambda line, **kw: printed.append(line)
        announce = quiet_announce(Reporter(quiet=True))
        for line in ("Triton server (embedded ...):", "  HTTP     127.0.0.1:8000", "Stop with Ctrl-C (SIGINT)."):
            announce(line)
    finally:
        builtins.print = original
    assert printed == ["  HTTP     127.0.0.1:8000"]


def test_k8s_needs_an_object_store_repository(capsys):
    from builder import cli

    assert cli.main(["k8s", "m", "--out", "o", "--no-validate"]) == 2
    assert f"--repository {DEFAULT_REPOSITORY}: the pods read their models from object storage" in \
        capsys.readouterr().err
    assert cli.main(["k8s", "m", "--repository", "s3://b/p", "--out", "o", "--no-validate"]) == 2
    assert capsys.readouterr().err.startswith("error: --repository 's3://b/p': bucket 'b' is not a valid bucket")


def test_tune_without_a_candidate_in_the_budget_is_exit_1_as_documented(tmp_path, monkeypatch, capsys):
    from builder import cli
    from builder.cli import tuning as tuning_verbs

    page = (ROOT / "docs" / "reference" / "grammar.md").read_text()
    assert "`tune` exits 1 when no candidate met `--p99-budget-ms`" in page
    assert "| 1 | a verification, check or budget failure" in (ROOT / "README.md").read_text()
    _model(tmp_path)
    record = {"model": "m", "winner": None, "exit_code": 1, "table": ["candidate  p99"],
              "summary": "no candidate met p99 <= 1 ms: nothing to write (exit 1)"}
    monkeypatch.setattr(tuning_verbs, "run_tune", lambda *a, **kw: record)
    argv = ["tune", "m", "--repository", str(tmp_path), "--p99-budget-ms", "1", "--seconds-per-candidate", "2m"]
    assert cli.main(argv) == 1
    capsys.readouterr()
    assert cli.main([*argv, "-o", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and document["winner"] is None and document["exit_code"] == 1
