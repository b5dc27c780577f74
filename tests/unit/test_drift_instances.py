"""A model served with several instances (one python-backend stub process each) keeps ONE drift window:
the last ``drift_window`` sampled rows the version served, whichever instance served them
(templates/python_backend/model.py ``_SharedWindow``). Triton keeps one series per metric name and
label set for all the stubs of a server, so the stand-in ``triton_python_backend_utils`` here does too:
what a test reads is what Prometheus would scrape, whichever instance set it last."""

from __future__ import annotations

import multiprocessing
import types

import numpy as np
import pytest

from tests.conftest import served_model_py

from builder.monitoring import drift, drift_profile

WINDOW = 128


class _Metric:
    def __init__(self, labels):
        self.labels, self.value = labels, None

    def set(self, value):
        self.value = value


class _Server:
    """Triton's metrics registry: one series per (name, labels), shared by every stub."""

    def __init__(self):
        self.series, self.warnings = {}, []

    def family(self, server):
        class Family:
            GAUGE, COUNTER = "gauge", "counter"

            def __init__(self, name, description, kind):
                self.name = name

            def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
                key = (self.name, tuple(sorted(labels.items())))
                return server.series.setdefault(key, _Metric(labels))

        return Family

    def gauge(self, name, **labels):
        return self.series[(name, tuple(sorted(labels.items())))].value


@pytest.fixture
def server():
    return _Server()


@pytest.fixture
def model_module(server):
    stand_in = types.ModuleType("triton_python_backend_utils")
    stand_in.MetricFamily = server.family(server)
    stand_in.Logger = types.SimpleNamespace(log_warn=server.warnings.append)
    with served_model_py(stand_in, "served_model_py_instances") as module:
        yield module


@pytest.fixture(scope="module")
def profile():
    """Like the probe's tok: token ids (validation ids in [0, 50)) and a classifier output."""
    rng = np.random.default_rng(7)
    return drift_profile.build_profile({"ids": rng.integers(0, 50, (2000, 12))},
                                       {"logits": rng.normal(size=(2000, 10)).astype(np.float32)})


def _rows(rng, count, shifted):
    for _ in range(count):
        high = (50, 100) if shifted else (0, 50)
        yield {"ids": rng.integers(*high, (1, 12))}, {"logits": rng.normal(size=(1, 10)).astype(np.float32)}


def _instances(model_module, profile, folder, count=2, **params):
    params = {"drift_window": str(WINDOW), "drift_observe_rows": "1", **params}
    hooks = [model_module._DriftHook(drift, profile, "tok", "1", params, batching=True, instances=count,
                                     shared_folder=str(folder)) for _ in range(count)]
    for hook in hooks:
        hook.clock = lambda: 0.0
    return hooks


def _published(server, profile):
    return {f: server.gauge("triton_builder_drift_psi", model="tok", version="1", feature=f)
            for f in profile["features"]}


def test_two_instances_publish_the_last_window_rows_whatever_instance_served_them(model_module, profile, server,
                                                                                  tmp_path):
    """The probe's finding 1: shifted traffic, then `drift_window` in-distribution rows, spread 70/30 over
    2 instances. Windows of their own kept up to 30 % shifted rows (the one publishing last held its last
    WINDOW rows, some from before) and the gauge stayed far over the threshold."""
    hooks = _instances(model_module, profile, tmp_path, drift_publish_every="8")
    reference = drift.DriftWindow(profile, window=WINDOW)  # one window over all the traffic, in order
    rng = np.random.default_rng(1)
    published, expected, samples = {}, {}, {}
    for phase, rows in (("shifted", 3 * WINDOW), ("in distribution", WINDOW)):
        for feeds, outputs in _rows(rng, rows, shifted=phase == "shifted"):
            hooks[int(rng.random() < 0.3)].observe(feeds, outputs)
            reference.observe(feeds, outputs)
        for hook in hooks:  # the next publish of any instance: what the gauges say now
            hook.publish()
        published[phase] = _published(server, profile)
        expected[phase] = {f: s["psi"] for f, s in reference.scores().items()}
        samples[phase] = server.gauge("triton_builder_drift_window_samples", model="tok", version="1")
    threshold = profile["thresholds"]["psi"]
    assert published["shifted"]["input:ids"] > 10 * threshold, published
    assert max(published["in distribution"].values()) < threshold, published
    assert published == {phase: pytest.approx(scores, rel=1e-12) for phase, scores in expected.items()}
    assert samples == {"shifted": WINDOW, "in distribution": WINDOW}
    assert {h.window.samples for h in hooks} == {WINDOW}
    for hook in hooks:
        hook.close()
    assert not list(tmp_path.iterdir()), "the last instance to finalize removes the window's file"


def test_an_idle_instance_neither_holds_stale_rows_nor_a_stale_gauge(model_module, profile, server, tmp_path):
    """Instance 1 served only shifted traffic, then nothing: instance 0's in-distribution rows replace its
    rows in the window, and instance 0's publish replaces the value instance 1 had set."""
    busy, idle = _instances(model_module, profile, tmp_path, drift_publish_every="1")
    rng = np.random.default_rng(2)
    for feeds, outputs in _rows(rng, WINDOW, shifted=True):
        idle.observe(feeds, outputs)
    assert _published(server, profile)["input:ids"] > 2.5
    for feeds, outputs in _rows(rng, WINDOW, shifted=False):
        busy.observe(feeds, outputs)
    assert max(_published(server, profile).values()) < profile["thresholds"]["psi"]
    for hook in (busy, idle):
        hook.close()


def _child(model_module, profile, folder, seed, calls):
    hook = _instances(model_module, profile, folder, count=1, drift_observe_rows="16")[0]
    rng = np.random.default_rng(seed)
    for _ in range(calls):
        rows = int(rng.integers(1, 6))
        hook.observe({"ids": rng.integers(0, 50, (rows, 12))}, {"logits": rng.normal(size=(rows, 10)).astype(np.float32)})
    hook.flush()
    hook.close()


def test_stub_processes_write_one_window_without_losing_updates(model_module, profile, tmp_path, monkeypatch):
    """Real processes writing at once (fork: they inherit the stand-in and the patched server key, as
    Triton's stubs share their parent): the running totals still equal a recount of the ring."""
    monkeypatch.setattr(model_module, "_server_key", lambda: "test-server")
    owner = _instances(model_module, profile, tmp_path, count=1)[0]
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_child, args=(model_module, profile, tmp_path, seed, 300)) for seed in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    assert [c.exitcode for c in children] == [0, 0, 0]
    window = owner.window
    assert window.samples == WINDOW and int(owner.shared.users[0]) == 1
    for feature in window._features:
        assert np.array_equal(feature.total, feature.ring.sum(axis=0)), feature.name
        assert feature.total.sum() == WINDOW * (12 if feature.name == "input:ids" else 1), feature.name
    owner.close()
    assert not list(tmp_path.iterdir())


def test_windows_of_another_server_or_layout_are_not_shared(model_module, profile, tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    first = _instances(model_module, profile, tmp_path, count=1)[0]
    other_size = _instances(model_module, profile, tmp_path, count=1, drift_window=str(WINDOW // 2))[0]
    monkeypatch.setattr(model_module, "_server_key", lambda: "another-server")
    other_server = _instances(model_module, profile, tmp_path, count=1)[0]
    for feeds, outputs in _rows(rng, 5, shifted=False):
        first.observe(feeds, outputs)
    assert (first.window.samples, other_size.window.samples, other_server.window.samples) == (5, 0, 0)
    assert len(list(tmp_path.iterdir())) == 3
    for hook in (first, other_size, other_server):
        hook.close()


def test_without_a_shared_file_each_instance_keeps_its_share_of_the_window(model_module, profile, server, tmp_path):
    """No writable folder: the model still serves; each of its 4 instances keeps a quarter of the window
    (it sees about a quarter of the traffic, so its rows span about the last drift_window rows), and
    Triton's log says the gauges show one instance's rows."""
    hooks = _instances(model_module, profile, tmp_path / "missing", count=4)
    assert {(h.shared, h.window.window) for h in hooks} == {(None, WINDOW // 4)}
    assert len(server.warnings) == 4 and "not shared by the model's 4 instance(s)" in server.warnings[0]
    for hook in hooks:
        hook.close()
