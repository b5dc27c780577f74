"""The CLI where things go wrong around the work: a bug (exit 3 with one line, not a traceback and
exit 1), a stdout whose reader went away (the work goes on), port flags out of range, twice or needing
root, a user module named like one of ours, a spec read under an ASCII-only locale."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import textwrap

import pytest

from builder.cli import main, make_parser, serving
from builder.core.errors import UserInputError
from builder.spec.fields import read_yaml
from tests.conftest import ROOT, run_cli
from tests.tiny_models import write_model


def _python(code: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    """``python -c code`` from the checkout, with its temp folder in ``tmp_path``."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TMPDIR=str(tmp_path), **env))


# a verb that fails the way a bug does; validate, as it needs nothing installed beyond the CLI
_BUG = """
    import sys
    import builder.cli, builder.cli.build

    def verb(args, reporter):
        raise {error}
    builder.cli.build.cmd_validate = verb
    sys.exit(builder.cli.main(["validate", "some_model"{more}]))
"""


@pytest.mark.parametrize("error, shown", [
    ("RuntimeError('injected\\nsecond line')", "RuntimeError: injected second line"),
    ("ConnectionResetError(errno.ECONNRESET, 'reset by peer')", r"ConnectionResetError: \[Errno 104\] reset by peer"),
])
def test_an_internal_error_exits_3_with_one_line_naming_the_traceback_file(tmp_path, error, shown):
    done = _python("import errno\n" + textwrap.dedent(_BUG.format(error=error, more="")), tmp_path)
    assert done.returncode == 3, done.stderr
    line, = done.stderr.splitlines()  # no traceback on the terminal
    found = re.fullmatch(rf"error: internal error \(a triton-builder bug\): {shown}; please report it with the "
                         rf"traceback: ({re.escape(str(tmp_path))}/triton-builder-traceback-\w+\.txt)", line)
    assert found, line
    kept = open(found.group(1)).read()
    assert kept.startswith("triton-builder ") and "Traceback (most recent call last)" in kept
    assert "in verb" in kept


def test_an_internal_error_under_v_prints_its_traceback_too(tmp_path):
    done = _python(_BUG.format(error="KeyError('lost')", more=', "-v"'), tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("error: internal error (a triton-builder bug): KeyError: 'lost'; please report")
    assert "Traceback (most recent call last)" in done.stderr and done.stderr.rstrip().endswith("KeyError: 'lost'")


def test_a_closed_stdout_stops_the_printing_not_the_command(tmp_path):
    """`... | head -1`: the verb still runs to its end and exits with its own code, quietly."""
    code = """
        import sys
        import builder.cli, builder.cli.build

        def verb(args, reporter):
            for i in range(20000):
                reporter(f"progress line {i}")
            print("the result")
            open(sys.argv[1], "w").write("done")
            return 1
        builder.cli.build.cmd_validate = verb
        sys.exit(builder.cli.main(["validate", "some_model"]))
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "finished")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away, as head does after its lines
    err = proc.stderr.read()
    assert proc.wait(60) == 1, err
    assert err == ""  # no BrokenPipeError, no "Exception ignored" at exit
    assert (tmp_path / "finished").read_text() == "done"


def test_an_error_into_a_closed_pipe_keeps_its_exit_code(tmp_path):
    """`... 2>&1 | head -0`: the error message cannot be read, but CI still gets exit 2, not 1."""
    code = """
        import sys
        import builder.cli, builder.cli.build
        from builder.core.errors import UserInputError

        def verb(args, reporter):
            reporter("a line")
            raise UserInputError("a long message " * 5000)
        builder.cli.build.cmd_validate = verb
        sys.exit(builder.cli.main(["validate", "some_model"]))
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    proc.stdout.close()
    assert proc.wait(60) == 2


@pytest.mark.slow(reason="runs a build through the CLI in a subprocess")
def test_a_build_piped_into_a_closed_pipe_still_publishes(tmp_path):
    spec = write_model(tmp_path, "argmax")
    proc = subprocess.Popen([sys.executable, "-m", "builder", "build", str(spec), "--repository",
                             str(tmp_path / "repo"), "--benchmark-seconds", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(300) == 0, err
    assert "BrokenPipeError" not in err
    assert (tmp_path / "repo" / "argmax" / "1").is_dir()  # published, with nobody reading


@pytest.mark.parametrize("argv, flag, value", [
    (["serve", "--http-port", "70000"], "--http-port", "70000"),
    (["serve", "--metrics-port", "0"], "--metrics-port", "0"),
    (["serve", "--grpc-port", "-1"], "--grpc-port", "-1"),
    (["replicas", "--grpc-port", "65536"], "--grpc-port", "65536"),
])
def test_a_port_outside_1_to_65535_is_refused_naming_the_flag(argv, flag, value, capsys):
    """70000 ended in an OverflowError traceback, 0 in a 60 s wait for a server on port 0."""
    with pytest.raises(SystemExit) as exited:
        make_parser().parse_args(argv)
    assert exited.value.code == 2
    assert (f"error: argument {flag}: {value} is not a port: give one from 1 to 65535, or leave the flag out to "
            "have one picked") in capsys.readouterr().err


def test_a_bad_port_exits_2_from_the_command_line():
    done = run_cli("serve", "--http-port", "http")
    assert done.returncode == 2
    assert "argument --http-port: 'http' is not a port number: give one from 1 to 65535" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, first, second", [
    (["serve", "--http-port", "18000", "--grpc-port", "18000"], "--http-port", "--grpc-port"),
    (["serve", "--grpc-port", "18001", "--metrics-port", "18001"], "--grpc-port", "--metrics-port"),
    (["replicas", "--http-port", "18000", "--grpc-port", "18000"], "--http-port", "--grpc-port"),
])
def test_one_port_given_to_two_flags_is_refused_before_anything_starts(tmp_path, argv, first, second, capsys):
    """Triton loaded every model, then printed its whole usage text before saying why."""
    port = argv[argv.index(first) + 1]
    assert main([*argv, "--repository", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: {first} {port} and {second} {port}: one port cannot serve both; "
                                       "give each its own port, or leave one out to have a free one picked\n")


def test_a_default_port_given_to_another_flag_is_not_taken_twice(monkeypatch):
    """--http-port 8001 alone gave gRPC its default 8001 as well."""
    monkeypatch.setattr(serving, "_bindable", lambda host, port: True)
    lines: list[str] = []
    args = make_parser().parse_args(["serve", "--http-port", "8001"])
    assert serving._ports(args, lines.append) == {"http": 8001, "grpc": None, "metrics": None}
    assert lines == ["note: port(s) 8001 given to another flag: serving on free ports instead; pass the printed "
                     "addresses to check/loadtest with --url (or choose ports with --http-port/--grpc-port/"
                     "--metrics-port)"]


def test_a_port_needing_root_is_not_called_in_use(monkeypatch):
    """--http-port 80 as a user said "in use by another process": the fix is another port above 1023."""
    from builder.core import ports
    from builder.core.processes import port_in_use, refuse_taken_ports

    monkeypatch.setattr(ports, "_bind_error", lambda host, port: OSError(errno.EACCES, "Permission denied"))
    monkeypatch.setattr(ports, "_unprivileged_start", lambda: 1024)
    with pytest.raises(UserInputError, match=r"^--http-port 80: 127\.0\.0\.1:80 needs privileges: ports below 1024 "
                                             r"need root here \(permission denied\); pick one from 1024 up, or "
                                             r"leave --http-port out to have a free one picked$"):
        refuse_taken_ports("127.0.0.1", [("--http-port", 80)])
    with pytest.raises(UserInputError, match=r"^127\.0\.0\.1:80 needs privileges"):
        port_in_use("127.0.0.1", 80)  # not True: free ports for the others would not help
    monkeypatch.setattr(ports, "_bind_error", lambda host, port: OSError(errno.EADDRINUSE, "Address in use"))
    assert port_in_use("127.0.0.1", 80) is True


def test_other_bind_refusals_say_their_own_reason():
    from builder.core.processes import port_in_use, refuse_taken_ports

    with pytest.raises(UserInputError, match=r"^--port 70000: 127\.0\.0\.1:70000 is not a port: pick one from 1 to "
                                             r"65535, or leave --port out"):
        refuse_taken_ports("127.0.0.1", [("--port", 70000)])  # was an OverflowError
    with pytest.raises(UserInputError, match=r"^--http-port 8000: 192\.0\.2\.1:8000 cannot be listened on: "
                                             r"192\.0\.2\.1 is not an address of this machine \(.+\); bind an "
                                             r"address it has"):
        refuse_taken_ports("192.0.2.1", [("--http-port", 8000)])  # TEST-NET-1: never this machine's
    with pytest.raises(UserInputError, match=r"^192\.0\.2\.1:8000 cannot be listened on"):
        port_in_use("192.0.2.1", 8000)


@pytest.mark.slow(reason="builds a model")
def test_a_user_module_named_like_one_the_build_uses_is_refused_and_ours_stay(tmp_path):
    """A user's builder.py: import_factory dropped triton-builder's own modules and imported the user's
    file in their place ("No module named 'builder.accuracy.tensors'; 'builder' is not a package")."""
    for name in ("builder", "onnx", "json"):
        (tmp_path / f"{name}.py").write_text("def build():\n    raise SystemExit('the user file ran')\n")
    done = _python(f"""
        import sys
        from pathlib import Path
        import builder.accuracy.tensors
        from builder.core.errors import UserInputError
        from builder.model.source import import_factory

        for name in ("builder", "onnx", "json"):
            try:
                import_factory(name + ":build", Path({str(tmp_path)!r}), "spec.yaml")
            except UserInputError as exc:
                print(exc)
        import builder.repository.layout  # still triton-builder's: nothing was dropped
        print(sys.modules["builder"].__file__, sys.modules["json"].__file__)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    builder_line, onnx_line, json_line, files = done.stdout.splitlines()
    assert builder_line == ("spec.yaml: field 'source.module': 'builder' is the name of triton-builder's own "
                            "package, which importing the spec's builder.py would replace for the whole build; "
                            "rename builder.py to a name of your own (e.g. builder_model.py) and set "
                            "source.module to match (builder_model:build)")
    assert onnx_line.startswith("spec.yaml: field 'source.module': 'onnx' is the name of the installed package "
                                "'onnx' (from onnx), which importing the spec's onnx.py would replace")
    assert json_line.startswith("spec.yaml: field 'source.module': 'json' is the name of the module 'json' this "
                                "process already uses (")
    assert str(tmp_path) not in files


@pytest.mark.slow(reason="runs a build through the CLI in a subprocess")
def test_a_build_of_a_user_builder_module_exits_2_naming_the_fix(tmp_path):
    spec = write_model(tmp_path, "argmax", source={"module": "builder:build"})
    (spec.parent / "model.py").rename(spec.parent / "builder.py")
    done = run_cli("build", str(spec), "--repository", str(tmp_path / "repo"), "--benchmark-seconds", "0", "-q")
    assert done.returncode == 2, done.stderr
    assert "error: spec.yaml: field 'source.module': 'builder' is the name of triton-builder's own package" in done.stderr
    assert "rename builder.py to a name of your own (e.g. builder_model.py)" in done.stderr


def test_a_utf8_spec_reads_under_an_ascii_only_locale(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes("\ufeffname: m  # modèle à tester\ndescription: café\n".encode("utf-8"))  # with a BOM
    done = _python(f"""
        from pathlib import Path
        from builder.spec.fields import read_yaml
        print(read_yaml(Path({str(spec)!r}))["description"].encode("unicode_escape").decode())
    """, tmp_path, PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", LC_ALL="C")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "caf\\xe9\n"


def test_a_spec_that_is_not_utf8_names_the_byte_and_line(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes("name: m\ndescription: café\n".encode("latin-1"))
    with pytest.raises(UserInputError, match=r"^spec\.yaml: not UTF-8 text \(byte 0xe9 at line 2\); save it as "
                                             r"UTF-8$"):
        read_yaml(spec)


def test_non_ascii_output_under_an_ascii_only_locale_is_escaped_not_a_crash(tmp_path):
    done = _python("""
        import sys
        import builder.cli, builder.cli.build

        def verb(args, reporter):
            reporter("building mod\\u00e8le")
            print("caf\\u00e9")
            return 0
        builder.cli.build.cmd_validate = verb
        sys.exit(builder.cli.main(["validate", "some_model"]))
    """, tmp_path, PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", LC_ALL="C")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "building mod\\xe8le\ncaf\\xe9\n"
