"""triton-builder: PyTorch model -> verified, optimised Triton model repository -> served, checked,
load-tested and monitored deployment.

Public API (the CLI forwards to these)::

    from builder import build, validate
    result = build("examples/digits/spec.yaml", repository="model_repository")
    report = validate("model_repository/digits_cnn")
"""

from __future__ import annotations

from builder.errors import BuilderError, ServerError, UserInputError, VerificationError

__all__ = ["build", "validate", "check", "serve", "select", "BuilderError", "UserInputError", "VerificationError",
           "ServerError"]


def build(*args, **kwargs):
    from builder.pipeline import build as _build
    return _build(*args, **kwargs)


def validate(*args, **kwargs):
    from builder.repository.validate import validate_model
    return validate_model(*args, **kwargs)


def check(*args, **kwargs):
    from builder.serving.check import check_served
    return check_served(*args, **kwargs)


def select(*args, **kwargs):
    from builder.repository.reselect import select_for_host
    return select_for_host(*args, **kwargs)


def serve(*args, **kwargs):
    from builder.serving.serve import serve_forever
    return serve_forever(*args, **kwargs)
