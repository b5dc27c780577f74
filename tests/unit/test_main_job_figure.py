"""The main job's perf_analyzer figure (builder/main_job.py): measured once the load test's requests are
done, retried when a try does not settle, and said plainly to be a lower bound when none does. The
perf_analyzer results are injected; nothing is timed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from builder import main_job
from builder.main_job import PA_TRIES, ServedFigure, figure_line, settled_measurement
from builder.tuning.client import LevelResult


def level(throughput: float, stable: bool, failures: int = 0) -> LevelResult:
    return LevelResult(8, throughput, 10.0, 14.0, 18.0, 11.0, requests=int(throughput * 3), failures=failures,
                       stable=stable, windows=3, seconds=4.0, errors=["boom"] if failures else [])


def tries(*levels: LevelResult):
    """A measure() that gives ``levels`` in turn, and the list of calls made."""
    given = list(levels)
    calls = []

    def measure():
        calls.append(1)
        return given.pop(0)

    return measure, calls


def test_a_try_that_settles_is_taken_at_once():
    measure, calls = tries(level(800, True), level(900, True))
    got, made = settled_measurement(measure)
    assert (got.throughput, made, len(calls)) == (800, 1, 1)
    line = figure_line(got, 8, made)
    assert line == ("800 req/s at concurrency 8 over gRPC, p50 10.0 ms, p99 18.0 ms (settled: 3 windows of 1 s "
                    "within 10 %)")
    assert "lower bound" not in line


def test_a_try_that_does_not_settle_is_retried_and_the_settled_one_reported():
    measure, calls = tries(level(350, False), level(810, True))
    got, made = settled_measurement(measure)
    assert (got.throughput, got.stable, made, len(calls)) == (810, True, 2, 2)
    assert figure_line(got, 8, made).endswith("(settled: 3 windows of 1 s within 10 %, on try 2 of 2: the first "
                                              "did not settle)")


def test_none_settling_is_a_lower_bound_said_plainly_with_why():
    measure, calls = tries(level(350, False), level(420, False), level(999, True))
    got, made = settled_measurement(measure, tries=2)
    assert (got.throughput, got.stable, made, len(calls)) == (420, False, 2, 2)  # bounded; the faster try
    line = figure_line(got, 8, made, tries=2, load=(2.6, 2))
    assert line.startswith("at least 420 req/s at concurrency 8 over gRPC, p50 10.0 ms")
    assert "(a lower bound: perf_analyzer's 1 s windows did not agree within 10 % in 2 tries of up to 8 s" in line
    assert "load average 2.6 on 2 cores; the faster try is shown)" in line


def test_a_failed_try_ends_the_measurement():
    measure, calls = tries(level(0, False, failures=1), level(800, True))
    got, made = settled_measurement(measure)
    assert (got.failures, made, len(calls)) == (1, 1, 1)


def test_the_default_is_a_bounded_retry():
    assert PA_TRIES == 2 and main_job.PA_WINDOW_S >= 1.0


def test_idle_waits_for_the_servers_count_to_stop_moving():
    counts = iter([100, 140, 150, 150, 150])
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    idle = main_job._wait_until_idle(lambda: SimpleNamespace(success=next(counts), fail=0), timeout=5,
                                     interval=0.25, clock=lambda: now[0], sleep=sleep)
    assert idle and len(sleeps) == 3


def test_idle_gives_up_after_its_timeout():
    counter = iter(range(1000))
    now = [0.0]

    def sleep(s):
        now[0] += s

    idle = main_job._wait_until_idle(lambda: SimpleNamespace(success=next(counter), fail=0), timeout=1,
                                     interval=0.25, clock=lambda: now[0], sleep=sleep)
    assert not idle and now[0] == pytest.approx(1.0)


class FakeEngine:
    """perf_analyzer's engine with injected results; records what happened in ``events``."""

    def __init__(self, results, events):
        self.results, self.events = list(results), events
        self.tool = SimpleNamespace(version="2.51.0")

    def prepare(self, *args, **kwargs):
        self.events.append("prepare")

    def measure(self, concurrency, *, window_s, max_s, stats=None):
        self.events.append(("measure", concurrency, window_s, max_s))
        return self.results.pop(0)


@pytest.fixture
def wired(monkeypatch, tmp_path):
    """_perf_analyzer with its engine, model lookup and statistics replaced (in builder/main_job.py, which
    binds them)."""

    events: list = []

    def install(results):
        engine = FakeEngine(results, events)
        monkeypatch.setattr(main_job, "PerfAnalyzerEngine", FakeEngine)
        monkeypatch.setattr(main_job, "choose_engine", lambda *a, **k: engine)
        monkeypatch.setattr(main_job, "fetch_model", lambda *a: SimpleNamespace(name="m"))
        monkeypatch.setattr(main_job, "load_samples", lambda *a: ([], "generated"))

        class Reader:
            def __init__(self, *a):
                pass

            def snapshot(self, model):
                events.append("snapshot")
                return SimpleNamespace(success=5, fail=0)

            def close(self):
                events.append("close")

        monkeypatch.setattr(main_job, "StatsReader", Reader)
        monkeypatch.setattr(main_job.time, "sleep", lambda s: None)
        server = SimpleNamespace(grpc_url="127.0.0.1:8001")
        said: list[str] = []
        figure = main_job._perf_analyzer("m", server, 8, tmp_path / "model_repository", said.append)
        return figure, said, events

    return install


def test_the_job_measures_after_the_server_is_idle_and_retries_once(wired):
    figure, said, events = wired([level(300, False), level(790, True)])
    assert isinstance(figure, ServedFigure) and figure.settled and figure.rps == 790
    line, rps = figure  # unpacks as (line, req/s), as before
    assert rps == 790 and said == [f"  perf_analyzer 2.51.0: {line}"]
    first_measure = events.index(("measure", 8, main_job.PA_WINDOW_S, main_job.PA_MAX_S))
    assert events[:first_measure] == ["prepare", "snapshot", "snapshot"]  # idle before measuring
    assert events.count(("measure", 8, main_job.PA_WINDOW_S, main_job.PA_MAX_S)) == 2 and events[-1] == "close"


def test_the_job_reports_a_lower_bound_and_no_ratio_to_it(wired):
    figure, said, _ = wired([level(300, False), level(420, False)])
    assert not figure.settled and figure.rps == 420 and figure.line.startswith("at least 420 req/s")
    assert "a lower bound" in said[0]


def test_a_failed_measurement_is_said_and_gives_no_figure(wired):
    figure, said, _ = wired([level(0, False, failures=1)])
    assert figure is None and said == ["  perf_analyzer failed: boom"]
