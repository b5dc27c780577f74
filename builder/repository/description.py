"""The one typed description of a model version: what stage publish hands to the repository.

Usage::

    with reserve_version(repository, "digits_cnn", requested=None) as reservation:  # layout.py
        description = VersionDescription(name="digits_cnn", version=reservation.version, config=config,
                                         model_format="onnx", model_files=[work / "model.onnx"],
                                         runtime_files={}, extra_files={"reference.npz": npz_bytes},
                                         metadata={"model_name": "digits_cnn", "version": None, ...})
        published = publish_model(repository, description, reservation)   # builder/repository/publish.py

The description is plain data: nothing in it writes into a repository or calls back into the
version folder. builder/repository/ alone writes it, atomically (builder/repository/layout.py):

- ``model_files`` are copied under the backend's file name (``model.onnx``/``model.pt``/``model.plan``;
  companions such as ONNX external data keep their suffix), then ``runtime_files`` (the python
  backend's ``model.py`` and ``drift.py``) under their names;
- ``extra_files`` are written as given: bytes, or a writer that returns bytes (called while the
  version is staged, so a failing writer leaves the repository as it was);
- ``metadata.yaml`` is rendered by the repository from ``metadata`` with ``version`` and
  ``files_sha256`` (name -> sha256 of every file above: model, runtime and extra files) filled in;
- ``warmup_files`` (a config rendered from ``config``: made from reference.npz here) go to the model
  folder's ``warmup/`` before the config that names them;
- with ``signing_key``, ``signed_config.pbtxt`` (the config.pbtxt published with it) and ``model.sig``
  over every file of the version folder (builder/repository/signing.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

from builder.repository.config import ModelConfig
from builder.repository.signing import SigningKey

FileContent = Union[bytes, Callable[[], bytes]]


@dataclass(frozen=True)
class VersionDescription:
    name: str  # the model's name in the repository
    config: ModelConfig  # rendered into config.pbtxt
    model_format: str  # onnx | torchscript | plan: decides the model file's name
    model_files: list[Path]  # the main model file first, then its companions
    version: int | None = None  # None: the next free number
    runtime_files: dict[str, Path] = field(default_factory=dict)  # copied beside the model and hashed
    extra_files: dict[str, FileContent] = field(default_factory=dict)  # relative name -> content, hashed too
    metadata: dict[str, Any] | None = None  # metadata.yaml; "version" and "files_sha256" filled in on publish
    # config.pbtxt as given, already checked with Triton's schema (`select` republishes a served config with
    # its name and sizing changed); None: rendered from ``config``, whose name and backend count either way
    config_text: str | None = None
    signing_key: SigningKey | None = None  # sign the version (model.sig; builder/repository/signing.py)
    # files the config reads from the MODEL folder (Triton's warmup/<input>.<hash>.bin: warmup_data.py); a
    # build's are made by publish_model from reference.npz, a republished config's are read from its source
    warmup_files: dict[str, bytes] = field(default_factory=dict)
