"""Optional dependencies: imported only by the verbs that need them, with an error naming the extra.

pyproject.toml's extras: ``s3`` (boto3: ``publish --to s3://``, ``serve``/``check``/``replicas
--repository s3://``), ``k8s`` (kubernetes-validate: the ``k8s`` verb's offline validation) and ``gpu``
(tensorrt). A missing one is a UserInputError (exit 2) that says what to install, never a traceback.

Usage::

    from builder.core.extras import require

    boto3 = require("boto3", "an s3:// repository")
    # missing -> UserInputError: an s3:// repository needs boto3: pip install 'triton-builder[s3]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from builder.core.errors import UserInputError

__all__ = ["require", "EXTRA_OF"]

#: top-level module -> (the PyPI package that provides it, the triton-builder extra that installs it)
EXTRA_OF: dict[str, tuple[str, str]] = {
    "boto3": ("boto3", "s3"),
    "botocore": ("boto3", "s3"),
    "kubernetes_validate": ("kubernetes-validate", "k8s"),
    "tensorrt": ("tensorrt", "gpu"),
    "model_signing": ("model-signing", "signing"),
    "OpenSSL": ("pyopenssl", "signing"),
    "transformers": ("transformers", "examples"),
    "tokenizers": ("tokenizers", "examples"),
}


def require(module: str, needed_by: str, hint: str = "") -> ModuleType:
    """Import ``module`` (e.g. ``"botocore.config"``); if its package is missing, raise a UserInputError
    "``needed_by`` needs PACKAGE: pip install 'triton-builder[EXTRA]'" (``hint`` appended in brackets)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = (err.name or module).split(".")[0]
        if missing not in EXTRA_OF:  # some other package is broken: that is not a missing extra
            raise
        package, extra = EXTRA_OF[missing]
        message = f"{needed_by} needs {package}: pip install 'triton-builder[{extra}]'"
        raise UserInputError(message + (f" ({hint})" if hint else "")) from None
