"""serve's repository watch (builder/serving/watch.py) with a stand-in for the server's model control (named as
such: the real server's reloads are tests/integration/test_serve_follows_rollback.py): what counts as a change,
the settle time, steps before their ensembles, new folders, and a refused reload."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from builder.core.errors import ServerError
from builder.serving.watch import RepositoryWatch, folder_state

MODEL = 'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
ENSEMBLE = '''name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [{{ name: "x" data_type: TYPE_FP32 dims: [4] }}]
output [{{ name: "y" data_type: TYPE_FP32 dims: [4] }}]
ensemble_scheduling {{ step [{{ model_name: "{step}" model_version: -1
  input_map {{ key: "x" value: "x" }} output_map {{ key: "y" value: "y" }} }}] }}
'''


class StandInServer:
    """The model-control surface RepositoryWatch uses (load_model, models, failed, triton().model_metadata): a
    load serves the newest version folder on disk, as the default version policy would."""

    def __init__(self, repository: Path, models: list[str], refuse: set[str] = frozenset()):
        self.repository, self.models, self.failed, self.refuse = repository, list(models), {}, set(refuse)
        self.loads: list[str] = []
        self.answering = {name: self._newest(name) for name in models}

    def _newest(self, name: str) -> list[str]:
        versions = sorted(int(p.name) for p in (self.repository / name).iterdir() if p.name.isdigit())
        return [str(versions[-1])] if versions else []

    def load_model(self, name: str) -> None:
        if name in self.refuse:
            raise ServerError(f"tritonserver could not load model '{name}': bad config")
        self.loads.append(name)
        self.answering[name] = self._newest(name)
        if name not in self.models:
            self.models.append(name)

    @contextlib.contextmanager
    def triton(self):
        answering = self.answering

        class Client:
            def model_metadata(self, name):
                if name not in answering:
                    raise KeyError(name)  # Triton: unknown model
                return {"versions": answering[name]}

        yield Client()


def _model(repo: Path, name: str, versions=(1,), text: str | None = None) -> None:
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(text or MODEL.format(name=name))
    for v in versions:
        (folder / str(v)).mkdir(exist_ok=True)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _watch(server, announced, clock, **kwargs) -> RepositoryWatch:
    return RepositoryWatch(server, announced.append, interval=1.0, settle=0.5, clock=clock, sleep=clock.sleep, **kwargs)


def test_a_new_version_and_a_config_change_are_reloaded_and_nothing_else(tmp_path):
    _model(tmp_path, "digits")
    server, announced, clock = StandInServer(tmp_path, ["digits"]), [], Clock()
    watch = _watch(server, announced, clock)
    clock.now = 1.0
    assert watch.poll() == []  # nothing changed
    (tmp_path / "digits" / "1" / "model.onnx").write_bytes(b"x")  # inside a version: not a reload
    (tmp_path / "digits" / "rollout.yaml").write_text("served_version: 1\n")  # a record beside config: neither
    clock.now = 2.0
    assert watch.poll() == [] and server.loads == []
    (tmp_path / "digits" / "2").mkdir()
    clock.now = 2.5
    assert watch.poll() == []  # not before the interval
    clock.now = 3.0
    assert watch.poll() == ["digits"]
    assert announced == ["  watch    digits changed on disk: reloaded, now answering with version 2 (was 1)"]
    (tmp_path / "digits" / "config.pbtxt").write_text(MODEL.format(name="digits") + "version_policy { latest { num_versions: 1 } }\n")
    clock.now = 5.0
    assert watch.poll() == ["digits"] and server.loads == ["digits", "digits"]


def test_a_change_still_under_way_waits_until_it_settles(tmp_path):
    _model(tmp_path, "digits")
    server, clock = StandInServer(tmp_path, ["digits"]), Clock()
    watch = _watch(server, [], clock)
    (tmp_path / "digits" / "2").mkdir()

    def sleep(seconds):  # a second change lands while the watch waits to see the first settle
        clock.now += seconds
        if not (tmp_path / "digits" / "3").exists():
            (tmp_path / "digits" / "3").mkdir()

    watch._sleep = sleep
    clock.now = 1.0
    assert watch.poll() == [] and server.loads == []
    watch._sleep = clock.sleep
    clock.now = 2.5
    assert watch.poll() == ["digits"]


def test_steps_are_reloaded_before_their_ensemble_and_new_folders_load(tmp_path):
    _model(tmp_path, "a_pipeline", text=ENSEMBLE.format(name="a_pipeline", step="z_model"))
    _model(tmp_path, "z_model")
    server, announced, clock = StandInServer(tmp_path, ["a_pipeline", "z_model"]), [], Clock()
    watch = _watch(server, announced, clock)
    (tmp_path / "a_pipeline" / "2").mkdir()
    (tmp_path / "z_model" / "2").mkdir()
    _model(tmp_path, "newcomer")
    clock.now = 1.0
    assert watch.poll() == ["newcomer", "z_model", "a_pipeline"]
    assert announced[0] == "  watch    newcomer changed on disk: reloaded, now answering with version 1 (new)"


def test_only_the_models_asked_for_when_serving_a_list(tmp_path):
    _model(tmp_path, "digits")
    server, clock = StandInServer(tmp_path, ["digits"]), Clock()
    watch = _watch(server, [], clock, whole_repository=False)
    _model(tmp_path, "other")
    clock.now = 1.0
    assert watch.poll() == [] and server.loads == []


def test_a_refused_reload_is_announced_and_the_server_keeps_what_it_had(tmp_path):
    _model(tmp_path, "digits")
    server, announced, clock = StandInServer(tmp_path, ["digits"], refuse={"digits"}), [], Clock()
    watch = _watch(server, announced, clock)
    (tmp_path / "digits" / "2").mkdir()
    clock.now = 1.0
    assert watch.poll() == []
    assert announced == ["  watch    digits changed; Triton refused to load it, so it keeps answering with what it "
                         "had: tritonserver could not load model 'digits': bad config"]
    assert watch.reloads == [("digits", False)]
    clock.now = 2.0
    assert watch.poll() == []  # the same state is not retried until it changes again


@pytest.mark.parametrize("change", ["replace_version", "config"])
def test_folder_state_sees_a_version_replaced_whole_and_a_config_rewrite(tmp_path, change):
    _model(tmp_path, "m")
    before = folder_state(tmp_path / "m")
    if change == "config":
        (tmp_path / "m" / "config.pbtxt").write_text(MODEL.format(name="m") + "# tuned\n")
    else:
        (tmp_path / "m" / "1").rename(tmp_path / "old")
        (tmp_path / "m" / "1").mkdir()
    assert folder_state(tmp_path / "m") != before
