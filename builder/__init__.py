"""triton-builder: PyTorch model -> verified, optimised Triton model repository -> served, checked,
load-tested and monitored deployment.

Public API (builder/api.py; the CLI's verbs do the same). A model is named the same way everywhere:
its ``name`` first, then the ``repository`` it lives in (default ``"model_repository"``)::

    import builder

    result = builder.build("examples/digits/spec.yaml", "model_repository")
    report = builder.validate("digits_cnn", "model_repository")
    with builder.serving_context("model_repository") as server:
        checked = builder.check("digits_cnn", "model_repository", url=server.http_url)
        load = builder.loadtest("digits_cnn", "model_repository", url=server.http_url, run_time_s=10)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from builder.core.errors import BuilderError, ServerError, UserInputError, VerificationError

if TYPE_CHECKING:
    from builder.api import (LoadTestResult, SweepResult, TuneResult, build, check, install_backends, loadtest,
                             rollback, select, serve, serving_context, sweep, tune, validate)

__all__ = ["build", "validate", "check", "select", "rollback", "serve", "serving_context", "loadtest", "sweep",
           "tune", "install_backends",
           "LoadTestResult", "SweepResult", "TuneResult",
           "BuilderError", "UserInputError", "VerificationError", "ServerError"]


def __getattr__(name: str):
    """The verbs load the library on first use, so ``import builder`` stays light (no numpy, torch or onnx)."""
    if name in __all__:
        import builder.api  # deferred: the library imports numpy; `import builder` must not

        return getattr(builder.api, name)
    raise AttributeError(f"module 'builder' has no attribute {name!r}")
