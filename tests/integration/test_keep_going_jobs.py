"""`replicas` and `run` keep serving a repository where an unrelated model fails to load, as `serve` does:
each failed model is announced with Triton's reason, the rest is served. `run` still fails when the model
the job is about fails, and `run --keep-serving` stops on a signal as `serve` does. Real tritonserver (and
nginx for `replicas`)."""

from __future__ import annotations

import os
import re
import signal
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.core.errors import ServerError

pytestmark = pytest.mark.integration

BOOM = "boom-in-initialize-7741"
BAD_PY = f"class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('{BOOM}')\n"
ADD_ONE_PY = textwrap.dedent("""
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + 1)]) for r in requests]
    """)


def python_model(repo: Path, name: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n")
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def nginx():
    from builder.scaleout.balancer import find_nginx

    try:
        return find_nginx()
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"nginx not installed: {err}")


def test_replicas_serve_the_models_that_load_and_name_the_one_that_failed(nginx, tmp_path):
    python_model(tmp_path, "good", ADD_ONE_PY)
    python_model(tmp_path, "good__variant", BAD_PY)

    from builder.scaleout.replicas import run_replicas

    said: list[str] = []

    def announce(text: str) -> None:  # stops the session once it has announced itself
        said.append(text)
        if text.startswith("New versions are rolled out"):
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()

    code = run_replicas(tmp_path, 2, prometheus=False, watch_seconds=60, announce=announce)
    out = "\n".join(said)
    assert code == 0, out  # was: exit 2, "tritonserver could not load model 'good__variant'", nothing served
    assert re.search(r"serving\s+good\n", out), out
    assert re.search(rf"FAILED\s+good__variant \(not served; fix it and restart to serve it\): UNAVAILABLE: .*{BOOM}",
                     out, re.S), out


def _fake_build(own_code: str):
    """The main job's build, as a python-backend model named ``job`` published beside a broken companion
    and a good one."""
    def build(spec, repository, progress=None):
        python_model(Path(repository), "job", own_code)
        python_model(Path(repository), "job__broken_companion", BAD_PY)
        python_model(Path(repository), "job__good_companion", ADD_ONE_PY)
        spec_ns = SimpleNamespace(name="job")
        context = SimpleNamespace(spec=spec_ns, selected=SimpleNamespace(name="python"))
        return SimpleNamespace(context=context, rows=[], published=[{"backend": "python"}])
    return build


@pytest.fixture
def job(monkeypatch):
    """The main job with everything but its server start stubbed: the build, the runtime gate, the check
    and the load tests (their own tests cover them)."""
    from builder import main_job  # it binds what it calls: build, load_spec, validate_model, check_served

    def use(own_code: str):
        monkeypatch.setattr(main_job, "build", _fake_build(own_code))
        # the job reads its spec before anything (its target, a typo in the path): the fake build needs none
        monkeypatch.setattr(main_job, "load_spec", lambda path: SimpleNamespace(deploy=SimpleNamespace(target="embedded")))
        monkeypatch.setattr(main_job, "validate_model", lambda *a, **k: SimpleNamespace(ok=True, lines=lambda: []))
        monkeypatch.setattr(main_job, "check_served", lambda *a, **k: SimpleNamespace(ok=True, version=1,
                                                                                  lines=lambda: ["OK"]))
        monkeypatch.setattr(main_job, "_load", lambda *a, **k: None)
        monkeypatch.setattr(main_job, "_perf_analyzer", lambda *a, **k: None)
    return use


def test_run_serves_its_own_model_beside_a_companion_that_fails(job, tmp_path):
    from builder.main_job import run_main_job

    job(ADD_ONE_PY)
    said: list[str] = []
    assert run_main_job("spec.yaml", tmp_path / "repo", progress=said.append) == 0, said
    out = "\n".join(said)
    assert re.search(rf"FAILED\s+job__broken_companion \(not served; fix it and restart to serve it\): "
                     rf"UNAVAILABLE: .*{BOOM}", out, re.S), out
    assert "server stopped" in out


def test_run_still_fails_when_its_own_model_fails_though_a_companion_loads(job, tmp_path):
    from builder.main_job import run_main_job

    job(BAD_PY)
    with pytest.raises(ServerError, match=rf"(?s)could not load model 'job':\n- job: UNAVAILABLE: .*{BOOM}.*\n"
                                          r"full log: .*repo-run/tritonserver/job\.log"):
        run_main_job("spec.yaml", tmp_path / "repo")


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_run_keep_serving_stops_on_a_signal_as_serve_does_even_with_sigint_ignored(job, tmp_path, stop):
    """A serving session: the signal is the stop it waits for, so the job's own verdict is its exit code
    (0), not 130; SIGINT inherited as ignored (started with `&` from a script) stops it too."""
    from builder.main_job import run_main_job

    job(ADD_ONE_PY)
    said: list[str] = []

    def progress(text: str) -> None:
        said.append(text)
        if "serving until Ctrl-C or SIGTERM" in text:
            threading.Timer(0.5, os.kill, (os.getpid(), getattr(signal, stop))).start()

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert run_main_job("spec.yaml", tmp_path / "repo", keep_serving=True, progress=progress) == 0, said
    finally:
        signal.signal(signal.SIGINT, previous)
    assert said[-2:] == [f"received {stop}; stopping tritonserver (pid {said[-2].split('pid ')[-1][:-1]})",
                         "server stopped"], said


def test_a_version_that_fails_to_load_in_a_rollout_is_tried_once(nginx, tmp_path):
    """Was: retried every --watch-seconds, each try taking replica 0 out of rotation (the other one took
    73 % of the load); as a version that fails its check, it waits for something new to be published."""
    import time

    from builder.scaleout.replicas import run_replicas

    python_model(tmp_path, "good", ADD_ONE_PY)
    said: list[str] = []

    def publish_broken_then_stop() -> None:
        (tmp_path / "good" / "2").mkdir()
        (tmp_path / "good" / "2" / "model.py").write_text(BAD_PY)
        deadline = time.monotonic() + 120
        while not any(line.startswith("rollout stopped") for line in said) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(5)  # five more polls
        os.kill(os.getpid(), signal.SIGINT)

    def announce(text: str) -> None:
        said.append(text)
        if text.startswith("New versions are rolled out"):
            threading.Thread(target=publish_broken_then_stop, daemon=True).start()

    code = run_replicas(tmp_path, 2, prometheus=False, watch_seconds=1, announce=announce)
    out = "\n".join(said)
    assert code == 2, out
    assert len([line for line in said if "loading good versions 2" in line]) == 1, out
    assert re.search(rf"rollout stopped: .*good.*{BOOM}", out, re.S), out
