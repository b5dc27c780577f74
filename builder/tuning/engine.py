"""The measurement engine of ``sweep`` and ``tune``: Triton's perf_analyzer or the in-process Python client.

``--engine auto`` (the default) measures with perf_analyzer when it is installed (or installs it now,
from PyPI, once: builder/tuning/perf_analyzer.py) and falls back to the Python client with a warning
when it cannot; ``perf_analyzer`` insists (an error naming the manual steps if it is missing);
``python`` uses the in-process closed-loop client (builder/tuning/client.py). Both give the same
``LevelResult`` per concurrency level, and both read Triton's statistics for the batch sizes the
server formed. perf_analyzer is the yardstick: C++, it takes less of the server's CPU than Python
threads do, so its throughput is what the server can do (on 2 shared cores the Python client read
0.77-0.93 of it).

Usage::

    engine = choose_engine("auto", say=print)          # Engine; a warning via say() when it falls back
    engine.prepare(url, "grpc", interface, samples, requests, batch_size=1, work_dir=Path("runs/x"))
    level = engine.measure(16, window_s=0.5, max_s=8.0, stats=reader)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from builder.core.errors import UserInputError
from builder.tuning.client import LevelResult, measure_level
from builder.tuning.pa_measure import input_data, measure_with_perf_analyzer, shape_args, uniform_samples
from builder.tuning.perf_analyzer import PerfAnalyzerMissing, find_perf_analyzer, install_perf_analyzer, manual_steps

ENGINES = ("auto", "perf_analyzer", "python")


class PythonEngine:
    """The in-process closed-loop client (threads of synchronous tritonclients)."""

    name = "python"

    def prepare(self, url: str, protocol: str, interface, samples, requests, *, batch_size: int = 1,
                work_dir: Path | None = None) -> None:
        self.url, self.protocol, self.model = url, protocol, interface.name
        self.requests, self.outputs = requests, interface.outputs

    def measure(self, concurrency: int, *, window_s: float, max_s: float, stats=None) -> LevelResult:
        return measure_level(self.url, self.protocol, self.model, self.requests, self.outputs, concurrency,
                             window_s=window_s, max_s=max_s, stats=stats)


class PerfAnalyzerEngine:
    """perf_analyzer, one run per level, with the requests' rows as its ``--input-data``."""

    name = "perf_analyzer"

    def __init__(self, tool):
        self.tool = tool

    def prepare(self, url: str, protocol: str, interface, samples: list[dict[str, np.ndarray]], requests, *,
                batch_size: int = 1, work_dir: Path | None = None) -> None:
        import tempfile


        self.url, self.protocol, self.model, self.batch_size = url, protocol, interface.name, batch_size
        self.work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="triton-builder-pa-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.data = self.work_dir / f"{interface.name}_input_data.json"
        if batch_size > 1:  # a request is built from consecutive steps: one shape for all of them
            samples = uniform_samples(samples)
        self.data.write_text(json.dumps(input_data(samples, interface.batching)))
        self.shapes = shape_args(interface.inputs, samples, interface.batching)

    def measure(self, concurrency: int, *, window_s: float, max_s: float, stats=None) -> LevelResult:
        return measure_with_perf_analyzer(self.tool, self.url, self.protocol, self.model, concurrency, self.data,
                                          work_dir=self.work_dir, batch_size=self.batch_size, window_s=window_s,
                                          max_s=max_s, stats=stats, shapes=self.shapes)


def choose_engine(choice: str = "auto", say: Callable[[str], object] = lambda m: None, *,
                  install: bool = True) -> PythonEngine | PerfAnalyzerEngine:
    """The engine for ``--engine choice``; ``install``: download perf_analyzer if it is missing."""

    if choice not in ENGINES:
        raise UserInputError(f"unknown --engine {choice!r}; supported: {', '.join(ENGINES)}; to add one: a class "
                             "with prepare() and measure() in builder/tuning/engine.py")
    if choice == "python":
        return PythonEngine()
    try:
        tool = install_perf_analyzer(progress=say) if install else find_perf_analyzer()
        if tool is None:
            raise PerfAnalyzerMissing(f"perf_analyzer is not installed; {manual_steps()}")
    except PerfAnalyzerMissing as exc:
        if choice == "perf_analyzer":
            raise UserInputError(f"--engine perf_analyzer: {exc}") from None
        say(f"warning: {exc}; measuring with the in-process Python client instead (it shares the server's CPU "
            "and reads lower; pass --engine python to silence this)")
        return PythonEngine()
    return PerfAnalyzerEngine(tool)
