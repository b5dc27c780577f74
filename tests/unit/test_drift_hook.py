"""The served drift hook (templates/python_backend/model.py ``_DriftHook``) without a server: sampled
calls of a batched model are gathered and binned together, and the window ends up holding exactly the
rows that binning each call would have put there. ``triton_python_backend_utils`` exists only inside
Triton's python-backend stub, so a stand-in with the metric classes the hook uses is installed here
(the real stub runs the hook in tests/integration/test_monitoring.py). Every hook keeps its shared
window file in the test's tmp_path; tests/unit/test_drift_instances.py covers several instances."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tests.conftest import served_model_py

from builder.monitoring import drift, drift_profile



class _Metric:
    def __init__(self, labels):
        self.labels, self.value = labels, None

    def set(self, value):
        self.value = value

    def increment(self, value):
        self.value = (self.value or 0) + value


class _Family:
    GAUGE, COUNTER = "gauge", "counter"

    def __init__(self, name, description, kind):
        self.name, self.metrics = name, []

    def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
        metric = _Metric(labels)
        self.metrics.append(metric)
        return metric


@pytest.fixture(scope="module")
def model_module():
    stand_in = types.ModuleType("triton_python_backend_utils")
    stand_in.MetricFamily = _Family
    with served_model_py(stand_in, "served_model_py") as module:
        yield module


@pytest.fixture
def make_hook(model_module, tmp_path):
    hooks = []

    def make(profile, params, batching=True):
        hook = model_module._DriftHook(drift, profile, "m", "1", params, batching=batching, shared_folder=str(tmp_path))
        hooks.append(hook)
        return hook

    yield make
    for hook in hooks:
        hook.close()
    assert not list(tmp_path.iterdir()), "the last instance to close removes the shared window file"


@pytest.fixture(scope="module")
def profile():
    rng = np.random.default_rng(7)
    images = rng.random((2000, 1, 8, 8)).astype(np.float32)
    logits = rng.normal(size=(2000, 10)).astype(np.float32)
    return drift_profile.build_profile({"image": images}, {"logits": logits})


def _calls(seed=1, count=150):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        rows = int(rng.integers(1, 5))
        yield rng.random((rows, 1, 8, 8)).astype(np.float32) * 0.6, rng.normal(size=(rows, 10)).astype(np.float32)


@pytest.mark.parametrize("observe_rows", ["1", "64"])
def test_gathered_rows_bin_like_one_call_at_a_time(make_hook, profile, observe_rows):
    params = {"drift_window": "128", "drift_publish_every": "1000", "drift_observe_rows": observe_rows}
    hook = make_hook(profile, params)
    hook.clock = lambda: 0.0  # rows never wait too long here (see test_rows_kept_too_long_are_binned)
    reference = drift.DriftWindow(profile, window=128)
    for images, logits in _calls():
        buffer = images.copy()
        hook.observe({"image": buffer[:]}, {"logits": logits})  # a view, like a request's input tensor
        buffer[:] = -1.0  # the request buffer is reused once execute() returns
        reference.observe({"image": images}, {"logits": logits})
    if observe_rows == "64":
        assert hook.pending, "rows are gathered, not binned one call at a time"
    hook.flush()
    assert hook.window.samples == reference.samples == 128
    got, expected = hook.window.current_props(), reference.current_props()
    assert got.keys() == expected.keys() and len(got) >= 2
    for feature in expected:
        assert np.allclose(got[feature], expected[feature]), feature


def test_publishing_bins_what_was_gathered_first_and_sampling_still_applies(make_hook, profile):
    params = {"drift_window": "512", "drift_publish_every": "10", "drift_sample_every": "2"}
    hook = make_hook(profile, params)
    hook.clock = lambda: 0.0
    for images, logits in _calls(count=20):
        hook.observe({"image": images}, {"logits": logits})
    # 20 calls, every 2nd sampled: 10 sampled calls -> one publish, after binning all of them
    assert hook.pending == [] and hook.window.sampled_calls == 1
    rows = sum(len(images) for images, _ in list(_calls(count=20))[::2])
    assert hook.window.samples == rows == int(hook.samples_metric.value)
    assert {m.labels["feature"] for m in hook.psi.metrics} == set(hook.window.features)


def test_rows_of_another_shape_flush_first(make_hook, profile):
    hook = make_hook(profile, {"drift_publish_every": "1000"})
    rng = np.random.default_rng(3)
    hook.observe({"image": rng.random((2, 1, 8, 8)).astype(np.float32)}, {"logits": rng.random((2, 10))})
    hook.observe({"image": rng.random((3, 1, 8, 8)).astype(np.float32)}, {"logits": rng.random((3, 10)).astype(np.float32)})
    assert hook.window.samples == 2 and hook.pending_rows == 3  # float64 logits then float32: two groups


def test_rows_kept_too_long_are_binned_at_the_next_call(make_hook, profile, model_module):
    """The window is shared by every instance: rows one of them gathers at a trickle would otherwise
    stay out of the window (and of every instance's gauges) until 64 had come."""
    hook = make_hook(profile, {"drift_publish_every": "1000"})
    now = [100.0]
    hook.clock = lambda: now[0]
    rng = np.random.default_rng(4)

    def call():
        hook.observe({"image": rng.random((1, 1, 8, 8)).astype(np.float32)},
                     {"logits": rng.normal(size=(1, 10)).astype(np.float32)})

    call()
    now[0] += model_module.PENDING_MAX_AGE_S / 2
    call()
    assert hook.window.samples == 0 and hook.pending_rows == 2
    now[0] += model_module.PENDING_MAX_AGE_S / 2  # the first row has waited PENDING_MAX_AGE_S
    call()
    assert hook.window.samples == 2 and hook.pending_rows == 1
