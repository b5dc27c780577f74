"""Where the files triton-builder reads at run time are, in a checkout and in an installed wheel alike.

The product's asset folders stay at the top of the repository (templates/, loadtest/, monitoring/)
and ship inside the wheel as package data under ``builder/_assets/`` (pyproject.toml's
``package-data``); in the checkout ``builder/_assets/<folder>`` is a symlink to the top-level folder,
so an editable install reads the files you edit. Everything is found with importlib.resources, never
by walking up from a module's own path to the checkout's folders (that works only in a checkout).

Usage::

    from builder.core import assets

    loader = jinja2.FileSystemLoader(str(assets.templates_dir()))   # config/*.j2, k8s/base/*.j2
    shutil.copyfile(assets.python_backend_model(), folder / "model.py")
    shutil.copyfile(assets.drift_module(), folder / "drift.py")
    conf = assets.loadtest_dir() / "locust.conf"                     # + locustfile.py, shapes.py
    scrape = assets.monitoring_dir() / "prometheus" / "prometheus.yml"
    cmd = [sys.executable, "-m", assets.EXPORTER_MODULE, ...]   # run by builder.monitoring.local_exporter

Every function returns a real ``pathlib.Path``: jinja2's FileSystemLoader, Locust, Prometheus and
promtool are given file names. pip installs wheels unpacked, so ``files()`` is a real folder; a
zipped install (zipimport) is refused with an error that says so, rather than copying whole folders
out to temporary files (``importlib.resources.as_file`` handles folders only from Python 3.12).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from builder.core.errors import BuilderError

__all__ = ["templates_dir", "python_backend_model", "monitor_step_model", "standin_backend_model", "drift_module", "pipeline_step", "loadtest_dir", "monitoring_dir",
           "EXPORTER_MODULE"]

#: ``python -m`` name of monitoring/exporter.py as installed (the checkout also has ``monitoring.exporter``).
EXPORTER_MODULE = "builder._assets.monitoring.exporter"


def _path(package: str, *parts: str) -> Path:
    root = files(package)
    if not isinstance(root, Path):
        raise BuilderError(f"triton-builder's package data ({package}) is not on the file system ({root}): "
                           "install triton-builder with pip (an unpacked wheel), not from a zip archive")
    path = root.joinpath(*parts)
    if not path.exists():
        raise BuilderError(f"{path} is missing from this triton-builder installation: reinstall it "
                           "(pip install --force-reinstall triton-builder, or `make setup` in a checkout)")
    return path


def templates_dir() -> Path:
    """templates/: config/*.pbtxt.j2 (Triton configs), k8s/base/*.j2, python_backend/model.py."""
    return _path("builder._assets", "templates")


def python_backend_model() -> Path:
    """templates/python_backend/model.py: the python-backend model published next to ONNX/TorchScript files."""
    return _path("builder._assets", "templates", "python_backend", "model.py")


def monitor_step_model() -> Path:
    """templates/monitor/model.py: the python step that monitors a standard model behind an ensemble
    (deploy.monitor; builder/repository/monitored.py)."""
    return _path("builder._assets", "templates", "monitor", "model.py")


def standin_backend_model() -> Path:
    """templates/embedded_standins/model.py: the embedded server's Python-based stand-in for Triton's C++
    onnxruntime, pytorch and openvino backends (laid out by builder/serving/install.py; never published)."""
    return _path("builder._assets", "templates", "embedded_standins", "model.py")


def pipeline_step(file_name: str) -> Path:
    """templates/pipeline/<file_name>: the python steps of a Hugging Face text pipeline (preprocess.py,
    postprocess.py) and the text_steps.py they share with the build."""
    return _path("builder._assets", "templates", "pipeline", file_name)


def drift_module() -> Path:
    """builder/monitoring/drift.py (numpy only): copied beside the python-backend model.py, which imports it."""
    return _path("builder.monitoring", "drift.py")


def loadtest_dir() -> Path:
    """loadtest/: locustfile.py (+ shapes.py, triton_target.py beside it) and locust.conf, which Locust is given by file name."""
    return _path("builder._assets", "loadtest")


def monitoring_dir() -> Path:
    """monitoring/: prometheus/ (scrape config, rules, rule tests), grafana/ (provisioning, dashboards)."""
    return _path("builder._assets", "monitoring")
