"""Which models of a repository the embedded Triton server can serve, and why not the others.

The backends come from builder/repository/config.py's registry (``BACKENDS``): a backend marked
``embedded`` is in the nvidia-pytriton wheel, one marked ``standin`` is served through a Python-based
stand-in (templates/embedded_standins/model.py); the platform names map to the backend Triton needs.

Usage::

    unsupported_models(Path("model_repository"))   # {"resnet_onnx": "platform onnxruntime_onnx needs ..."}
"""

from __future__ import annotations

from pathlib import Path

from builder.core.errors import UserInputError
from builder.repository.config import BACKENDS, parse_config

__all__ = ["EMBEDDED_BACKENDS", "STANDIN_BACKENDS", "PLATFORM_BACKENDS", "unsupported_models", "model_dirs"]

#: Backends the embedded server has, its own or a stand-in. Ensembles are run by the server core and need no backend.
EMBEDDED_BACKENDS: tuple[str, ...] = tuple(dict.fromkeys(b.triton_backend for b in BACKENDS.values()
                                                         if b.embedded or b.standin))
#: Those served through a Python-based stand-in for the C++ backend of the NGC image.
STANDIN_BACKENDS: tuple[str, ...] = tuple(dict.fromkeys(b.triton_backend for b in BACKENDS.values() if b.standin))

#: Platforms Triton knows that the builder does not write, with the backend each needs.
_OTHER_PLATFORMS = {"tensorflow_graphdef": "tensorflow", "tensorflow_savedmodel": "tensorflow", "openvino": "openvino"}

#: The backend Triton needs for each ``platform:`` value.
PLATFORM_BACKENDS: dict[str, str] = {
    **{b.name: b.triton_backend for b in BACKENDS.values() if b.name != b.triton_backend},
    **_OTHER_PLATFORMS,
}

_ALTERNATIVE = "serve it on the NGC image (docker compose on a GPU host), or build an onnx/torchscript/openvino variant"


def model_dirs(repository: Path) -> list[Path]:
    """Model folders of a repository, as Triton sees them (hidden entries skipped)."""
    return sorted(p for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith("."))


def unsupported_models(repository: Path) -> dict[str, str]:
    """``{model_name: reason}`` for every model in ``repository`` the embedded server cannot serve.

    Reads each ``<repository>/<model>/config.pbtxt`` into ``ModelConfig``. A model is left out when
    its platform or backend is not in ``EMBEDDED_BACKENDS``, when its config is missing or does not
    parse, when its ``name:`` differs from its folder, or when it is an ensemble with a step that
    is left out or not in the repository.
    """
    repository = Path(repository)
    if not repository.is_dir():
        raise UserInputError(f"model repository {repository} is not a directory; pass the folder holding one sub-folder per model")
    reasons: dict[str, str] = {}
    ensembles: dict[str, list[str]] = {}
    names = []
    for folder in model_dirs(repository):
        name = folder.name
        names.append(name)
        cfg_path = folder / "config.pbtxt"
        if not cfg_path.is_file():
            reasons[name] = f"no config.pbtxt in {folder}; the embedded server needs one that says backend: \"python\""
            continue
        try:
            config = parse_config(cfg_path.read_text(encoding="utf-8"), str(cfg_path))
        except (UserInputError, UnicodeDecodeError, OSError) as err:
            reasons[name] = str(err)
            continue
        if config.name and config.name != name:
            reasons[name] = f"{cfg_path} says name: \"{config.name}\" but the folder is '{name}'; Triton needs them equal"
            continue
        platform, backend = config.platform, config.backend
        if platform == "ensemble":
            ensembles[name] = [step.model_name for step in config.ensemble_scheduling.step]
            continue
        needed = backend or PLATFORM_BACKENDS.get(platform, "")
        if needed in EMBEDDED_BACKENDS:
            continue
        if not platform and not backend:
            reasons[name] = f"{cfg_path} names neither backend nor platform; the embedded server only runs backend: \"python\" models"
        elif platform and not backend and platform not in PLATFORM_BACKENDS:
            reasons[name] = f"platform {platform} needs a backend the embedded server does not have; {_ALTERNATIVE}"
        elif platform:
            reasons[name] = f"platform {platform} needs the '{needed}' backend, which the embedded server does not have; {_ALTERNATIVE}"
        else:
            reasons[name] = f"backend '{backend}' is not in the embedded server (it has only {', '.join(EMBEDDED_BACKENDS)}); {_ALTERNATIVE}"

    # Ensembles: left out if any step is; repeat until nothing changes (ensembles of ensembles).
    changed = True
    while changed:
        changed = False
        for name, steps in ensembles.items():
            if name in reasons:
                continue
            for step in steps:
                if step not in names:
                    reasons[name] = f"ensemble step model '{step}' is not in the repository"
                elif step in reasons:
                    reasons[name] = f"ensemble step model '{step}' is left out ({reasons[step]})"
                else:
                    continue
                changed = True
                break
    return {name: reasons[name] for name in names if name in reasons}
