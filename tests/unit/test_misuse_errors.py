"""User errors the prober found raw tracebacks or misleading texts for: each is one clear message naming
the option, field or file and the fix (docs/explanation/errors.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import UserInputError


def fake_model(repo: Path, name: str, versions=(1,)) -> Path:
    """A model folder as the repository holds it: config.pbtxt and numbered version folders."""
    folder = repo / name
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n')
    for version in versions:
        (folder / str(version)).mkdir()
        (folder / str(version) / "metadata.yaml").write_text("name: x\n")
    return folder


def test_register_names_the_missing_or_unsupported_registry(tmp_path, monkeypatch):
    from builder.storage.mlflow_registry import materialise, register_version

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model = fake_model(tmp_path / "repo", "m")
    with pytest.raises(UserInputError, match=r"--registry: which MLflow server\? pass --registry URL or set "
                                             r"\$MLFLOW_TRACKING_URI"):
        register_version(None, model)
    for url in ("notaurl", "file:///tmp/mlruns", "sqlite:///mlflow.db"):
        with pytest.raises(UserInputError, match=rf"--registry {url}: only http\(s\) MLflow tracking servers are "
                                                 r"supported; give the MLflow server's http\(s\):// URL"):
            register_version(url, model)
    with pytest.raises(UserInputError, match=r"--registry file:///x: only http\(s\) MLflow tracking servers"):
        materialise("models:/m/1", "file:///x")


def test_register_names_a_repository_given_for_a_model_folder(tmp_path):
    from builder.storage.mlflow_registry import register_version

    repo = tmp_path / "repo"
    fake_model(repo, "a")
    fake_model(repo, "b")
    with pytest.raises(UserInputError, match=rf"{repo} is a model repository, not a model folder; pass "
                                             rf"<repository>/<model name>: {repo / 'a'}, {repo / 'b'}"):
        register_version("http://127.0.0.1:1", repo)
    with pytest.raises(UserInputError, match=rf"{tmp_path / 'nope'}: no such model folder"):
        register_version("http://127.0.0.1:1", tmp_path / "nope")
    with pytest.raises(UserInputError, match=r"no version 3 to register \(versions there: 1\); pass --version"):
        register_version("http://127.0.0.1:1", repo / "a", version=3)
    with pytest.raises(UserInputError, match=r"empty: no version to register \(versions there: none\)"):
        register_version("http://127.0.0.1:1", fake_model(repo, "empty", versions=()))


@pytest.mark.parametrize("content", ["garbage", "pickled", "objects", "keys"])
def test_a_broken_reference_npz_is_named_and_never_unpickled(tmp_path, content):
    import pickle

    import numpy as np

    from builder.repository.metadata import read_reference

    path = tmp_path / "reference.npz"
    if content == "garbage":
        path.write_bytes(b"tamper\n")
    elif content == "pickled":
        path.write_bytes(pickle.dumps({"input/000_a/x": np.zeros(2)}))
    elif content == "objects":
        np.savez(path, **{"input/000_a/x": np.array([{"a": 1}], dtype=object)})
    else:
        np.savez(path, x=np.zeros(2))
    with pytest.raises(UserInputError, match=rf"{path}: not a plain numeric \.npz of reference cases as build writes "
                                             r"it \(.*\); it is never unpickled: rebuild the version with "
                                             r"triton-builder build"):
        read_reference(path)


def deny_writes_under(monkeypatch, folder: Path) -> None:
    """os.access says no for ``folder`` and below: a read-only mount or another user's folder (tests run
    as root, whom chmod does not stop; a real read-only bind mount needs privileges)."""
    import os

    real = os.access

    def access(path, mode, *args, **kwargs):
        inside = Path(path).resolve() == folder or folder in Path(path).resolve().parents
        return False if inside and mode & os.W_OK else real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def test_a_read_only_repository_is_refused_before_the_build(digits_copy, tmp_path, monkeypatch, quiet):
    from builder.pipeline import build

    locked = tmp_path / "locked"
    locked.mkdir()
    deny_writes_under(monkeypatch, locked)
    repo = locked / "repo"
    with pytest.raises(UserInputError, match=rf"--repository {repo}: the model repository is not writable "
                                             rf"\({locked}: permission denied\); it must be writable to publish or "
                                             r"tune into it: fix its permissions or mount, or choose another "
                                             r"--repository"):
        build(digits_copy / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0, progress=quiet)
    assert not repo.exists()


def test_a_repository_lock_that_cannot_be_written_is_a_user_error(tmp_path, monkeypatch):
    import errno

    from builder.repository import layout

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(layout, "open", read_only, raising=False)
    with pytest.raises(UserInputError, match=rf"--repository {tmp_path}: the model repository is not writable "
                                             r"\(Read-only file system\)"):
        with layout.reserve_version(tmp_path, "m"):
            pass


def test_select_and_tune_refuse_a_read_only_repository_before_measuring(tmp_path, monkeypatch):
    from builder.repository.reselect import select_for_host
    from builder.tuning.tune import run_tune

    repo = tmp_path / "repo"
    fake_model(repo, "m")
    deny_writes_under(monkeypatch, repo)
    message = rf"--repository {repo}: the model repository is not writable \(permission denied\)"

    def never(*args, **kwargs):
        raise AssertionError("measured before refusing the repository")

    with pytest.raises(UserInputError, match=message):
        select_for_host(repo, "m", measure=never, current_host={})
    for flags in ({"write": True}, {"publish": True}):
        # a dead URL: the refusal comes before the server is even asked
        with pytest.raises(UserInputError, match=message):
            run_tune("m", repo, "127.0.0.1:1", p99_budget_ms=50, out_dir=tmp_path / "out", **flags)
    with pytest.raises(UserInputError, match=r"--write and --publish: choose one"):
        run_tune("m", repo, "127.0.0.1:1", p99_budget_ms=50, out_dir=tmp_path / "out", write=True, publish=True)


def test_tune_cli_takes_write_or_publish_not_both(capsys):
    from builder import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["tune", "m", "--p99-budget-ms", "10", "--write", "--publish"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_an_output_folder_that_cannot_be_written_names_out(tmp_path, monkeypatch):
    from builder.core.files import output_folder

    (tmp_path / "file").write_text("x")
    with pytest.raises(UserInputError, match=rf"--out {tmp_path / 'file' / 'runs'}: cannot write the output folder "
                                             r"there \(.*\); pass --out with a writable folder"):
        output_folder(tmp_path / "file" / "runs")
    deny_writes_under(monkeypatch, tmp_path / "ro")
    (tmp_path / "ro").mkdir()
    with pytest.raises(UserInputError, match=r"ro: cannot write the output folder there \(not writable\)"):
        output_folder(tmp_path / "ro")
    assert output_folder(tmp_path / "ok" / "runs").is_dir()


@pytest.mark.parametrize("code, says", [("EROFS", "mounted read-only"), ("EACCES", "permission denied"),
                                        ("ENOSPC", "no space left"), ("EDQUOT", "quota")])
def test_the_cli_turns_a_file_system_refusal_into_a_message(monkeypatch, capsys, tmp_path, code, says):
    import errno
    import os

    from builder import cli
    from builder.cli import build as build_cli

    def refused(args, reporter):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), "/r/model_repository/x.tmp")

    monkeypatch.setattr(build_cli, "cmd_validate", refused)
    assert cli.main(["validate", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: /r/model_repository/x.tmp: {os.strerror(getattr(errno, code))}; ") and says in err
    assert "Traceback" not in err

    def other(args, reporter):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")

    monkeypatch.setattr(build_cli, "cmd_validate", other)
    # not the user's file system: a bug, exit 3 with its traceback in a file, not a message that blames the disk
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where that file goes
    assert cli.main(["validate", "x"]) == 3
    assert capsys.readouterr().err.startswith("error: internal error (a triton-builder bug): FileNotFoundError: ")


def test_clean_refuses_what_is_not_a_model_repository(tmp_path, monkeypatch, capsys):
    from builder import cli
    from builder.repository.layout import clean

    shape = r"a model repository is a folder of model folders, each holding config.pbtxt and numbered version"
    import tempfile
    (tmp_path / "tmp").mkdir()  # clean also sweeps the temp dir: its own, not the machine's (dead runs' folders)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "file").write_text("x")
    unrelated = tmp_path / "unrelated"
    (unrelated / "sub").mkdir(parents=True)
    (unrelated / "a.txt").write_text("x")
    for path, why in ((tmp_path / "missing", "no such folder"), (tmp_path / "file", "a file, not a folder"),
                      (unrelated, r"none of its 1 folder\(s\) is a model folder with config.pbtxt"),
                      (Path("/"), r"none of its \d+ folder\(s\) is a model folder with config.pbtxt")):
        with pytest.raises(UserInputError, match=rf"--repository {path}: no model repository there \({why}\); "
                                                 + shape):
            clean(path)
    repo = tmp_path / "repo"
    model = fake_model(repo, "m")
    (repo / "notes.txt").write_text("unrelated files beside models are fine")
    with pytest.raises(UserInputError, match=rf"--repository {model}: this is a model folder \(it holds "
                                             rf"config.pbtxt\); pass the repository above it: --repository {repo}"):
        clean(model)
    (tmp_path / "fresh").mkdir()  # a repository not built into yet
    (tmp_path / "readme_only").mkdir()  # the checkout's model_repository/: only its README.md
    (tmp_path / "readme_only" / "README.md").write_text("builds publish here")
    assert clean(repo) == [] and clean(tmp_path / "fresh") == [] and clean(tmp_path / "readme_only") == []
    assert cli.main(["clean", "--repository", str(unrelated)]) == 2
    assert "no model repository there" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # no model_repository here: only the temp dir's work folders
    assert cli.main(["clean"]) == 0 and "nothing to clean" in capsys.readouterr().out


def mix_interface(max_batch_size: int = 8):
    from builder.tuning.payload import ModelInterface

    return ModelInterface("mix_model", [("ids", "INT64", [6]), ("feats", "FP32", [3]), ("seq", "FP32", [-1])],
                          ["out"], max_batch_size, {})


def test_check_names_the_models_the_repository_has(tmp_path):
    from builder.serving.check import check_served

    repo = tmp_path / "repo"
    fake_model(repo, "digits_cnn")
    fake_model(repo, "mix_model")
    with pytest.raises(UserInputError, match=rf"model 'nosuch' is not in {repo} \(its models: digits_cnn, "
                                             r"mix_model\); name one of them, or pass the --repository that holds "
                                             r"'nosuch'"):
        check_served("nosuch", repository=repo)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match=r"model 'nosuch' is not in .*empty \(it holds no models\)"):
        check_served("nosuch", repository=tmp_path / "empty")


def test_loadtest_refuses_a_batch_size_the_model_cannot_take_before_locust(tmp_path, monkeypatch):
    from builder.tuning import loadtest, payload  # loadtest binds fetch_model
    from builder.tuning.loadtest import run_loadtest

    monkeypatch.setattr(loadtest, "fetch_model", lambda url, protocol, model: mix_interface(max_batch_size=0))
    with pytest.raises(UserInputError, match=r"^--batch-size 2: model 'mix_model' takes at most 1 row\(s\) per "
                                             r"request \(max_batch_size 0\); give --batch-size <= 1$"):
        run_loadtest("mix_model", "127.0.0.1:1", run_time_s=1, out_dir=tmp_path / "out", batch_size=2)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arrays, message", [
    ({"ids": ("float32", (4, 6))}, r"p.npz\['ids'\] is float32, the model takes INT64 \(int64\): save the "
                                   r"payload's 'ids' as int64"),
    ({"ids": ("int64", (4, 7))}, r"p.npz\['ids'\] has shape \[7\] per row, the model takes \[6\]: save the "
                                 r"payload's 'ids' with that shape per row"),
    ({"seq": ("float32", (4, 2, 5))}, r"p.npz\['seq'\] has shape \[2, 5\] per row, the model takes \[-1\] "
                                      r"\(-1: any size\)"),
])
def test_loadtest_and_sweep_refuse_a_payload_of_another_kind_or_shape(tmp_path, monkeypatch, arrays, message):
    import numpy as np

    from builder.tuning import loadtest, payload  # loadtest binds fetch_model
    from builder.tuning.loadtest import run_loadtest

    good = {"ids": ("int64", (4, 6)), "feats": ("float32", (4, 3)), "seq": ("float32", (4, 9))}
    path = tmp_path / "p.npz"
    np.savez(path, **{n: np.zeros(shape, dtype) for n, (dtype, shape) in {**good, **arrays}.items()})
    with pytest.raises(UserInputError, match=message):  # sweep's and tune's reading
        payload.load_samples(mix_interface(), path)
    monkeypatch.setattr(loadtest, "fetch_model", lambda url, protocol, model: mix_interface())
    with pytest.raises(UserInputError, match=message):
        run_loadtest("mix_model", "127.0.0.1:1", run_time_s=1, out_dir=tmp_path / "out", payload=path)
    assert not (tmp_path / "out").exists()


def test_loadtest_sweep_and_tune_refuse_a_repository_that_does_not_hold_the_model(tmp_path, monkeypatch):
    # the payload comes from --repository's reference.npz: generated inputs instead would test other data
    from builder.tuning import loadtest, payload  # loadtest binds fetch_model
    from builder.tuning.loadtest import run_loadtest

    repo = tmp_path / "repo"
    fake_model(repo, "mix_model")
    with pytest.raises(UserInputError, match=rf"--repository {repo / 'mix_model'}: this is a model folder .*"
                                             rf"pass the repository above it: --repository {repo}$"):
        payload.load_samples(mix_interface(), repository=repo / "mix_model")
    with pytest.raises(UserInputError, match=r"model 'mix_model' is not in .*other \(its models: digits_cnn\)"):
        fake_model(tmp_path / "other", "digits_cnn")
        payload.load_samples(mix_interface(), repository=tmp_path / "other")
    with pytest.raises(UserInputError, match=r"--repository .*typo: no model repository there \(no such folder\)"):
        payload.load_samples(mix_interface(), repository=tmp_path / "typo")
    monkeypatch.setattr(loadtest, "fetch_model", lambda url, protocol, model: mix_interface())
    with pytest.raises(UserInputError, match=r"this is a model folder"):
        run_loadtest("mix_model", "127.0.0.1:1", run_time_s=1, out_dir=tmp_path / "out", repository=repo / "mix_model")
    assert not (tmp_path / "out").exists()
    assert payload.default_payload(repo, "mix_model") is None  # the model, with no reference.npz: generated


def test_a_same_kind_payload_is_cast_by_the_harness_and_by_locust(tmp_path):
    import importlib.util

    import numpy as np

    from builder.tuning.loadtest import LOADTEST_DIR
    from builder.tuning.payload import load_samples

    path = tmp_path / "p.npz"
    np.savez(path, ids=np.zeros((2, 6), np.int32), feats=np.zeros((2, 3)), seq=np.zeros((2, 4), np.float32))
    samples, _ = load_samples(mix_interface(), path)
    assert samples[0]["ids"].dtype == np.int64 and samples[0]["feats"].dtype == np.float32
    spec = importlib.util.spec_from_file_location("triton_target", LOADTEST_DIR / "triton_target.py")
    target = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(target)
    rows = target._read_npz(str(path), ["ids", "feats", "seq"], True)
    cast = target._as_model_dtypes(rows, mix_interface().inputs)
    assert cast[0]["ids"].dtype == np.int64 and cast[0]["feats"].dtype == np.float32
    with pytest.raises(ValueError, match=r"--payload: 'ids' is float64, the model takes int64"):
        target._as_model_dtypes([{"ids": np.zeros((1, 6))}], mix_interface().inputs)


def test_a_failing_loadtest_prints_the_most_common_reason():
    from builder.tuning.loadtest import format_summary

    reason = "inference input 'feats' data-type is 'FP64', but model 'mix_model' expects 'FP32'"
    summary = {"model": "mix_model", "protocol": "http", "users": 2, "server": {},
               "client": {"requests": 10, "failures": 10, "rps": 5.0, "errors": {"timeout": 3, reason: 7}},
               "slo": {"met": False, "broken": ["failure ratio 1.0000 (10 of 10) > --slo-max-failure-ratio 0.01"]}}
    lines = format_summary(summary).splitlines()
    assert lines[1] == f"  most common failure (7 of 10): {reason}"
    summary["client"].update(failures=0, errors={})
    assert len(format_summary(summary).splitlines()) == 1


def test_loadtest_server_figures_that_are_not_this_runs_are_not_presented_as_the_servers():
    from builder.tuning.loadtest import format_summary

    server = {"requests": 1071, "error": None, "queue_us_per_request": 80.0, "compute_us_per_request": 300.0,
              "average_batch_size": 1.5, "batch_sizes": {"1": 500, "2": 285}}
    summary = {"model": "digits_cnn", "protocol": "http", "users": 8, "server": server, "counts_match": False,
               "client": {"requests": 2142, "failures": 0, "rps": 350.0, "errors": {}}, "slo": {"met": True}}
    line = format_summary(summary)
    # through a balancer the statistics request reached one replica: half the requests, not the server's view
    assert "; server figures from one backend: 1071 of 2142 requests - behind a balancer? (that backend: queue 80 us" \
           in line and "; server: " not in line
    server["requests"] = 3000
    assert "; server figures are not this run's: 3000 requests answered there, 2142 by the client's count - other " \
           "clients, or behind a balancer?" in format_summary(summary)
    server["requests"], summary["counts_match"] = 2142, True
    assert "; server: queue 80 us + compute 300 us per request, avg batch 1.5" in format_summary(summary)
