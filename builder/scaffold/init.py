"""`triton-builder init`: a commented spec.yaml drafted from an ONNX file, a TorchScript file, a Python
factory or a Hugging Face folder, for the user to review and build (the drafts: builder/scaffold/draft.py,
torch_sources.py, huggingface.py).

Usage::

    result = init_spec(Path("model.onnx"), Path("spec.yaml"))
    print("\n".join(result.lines()))
"""

from __future__ import annotations

import re
from pathlib import Path

from builder.core.errors import InternalError, UserInputError
from builder.scaffold.draft import ONNX_SUFFIXES, SUPPORTED, TORCHSCRIPT_SUFFIXES, InitResult, Value, onnx_draft, render
from builder.scaffold.huggingface import hf_draft
from builder.scaffold.torch_sources import module_draft, torchscript_draft
from builder.spec.model import parse_spec, validate_model_name


def init_spec(source: Path, out: Path, *, sample: Path | None = None, name: str | None = None,
              force: bool = False) -> InitResult:
    """Write a commented spec.yaml for ``source`` at ``out`` and say what it read, guessed and could not
    infer (see the module docstring). ``source``: model.onnx, a TorchScript file, ``model.py:factory``
    or a Hugging Face folder. Raises UserInputError (nothing written) for an existing ``out`` without
    ``force``, an unknown kind of source, or a model or sample that cannot be read."""

    out = Path(out).absolute()
    written = [out]
    _refuse_existing(out, force)
    if name is not None:
        validate_model_name(name, "--name")
    if sample is not None and not Path(sample).is_file():
        raise UserInputError(f"--sample: file not found: {sample}; give an .npz keyed by input name, samples first")
    text = str(source)
    match = re.fullmatch(r"(.+\.py):([A-Za-z_]\w*)", text)
    path = Path(match.group(1) if match else text)
    if not path.exists():
        raise UserInputError(f"{path}: no such file or folder; give one of: {'; '.join(SUPPORTED)}")
    if match:
        draft = module_draft(path.absolute(), match.group(2), out, sample)
    elif text.endswith(".py"):
        raise UserInputError(f"{path}: name the factory that returns the torch.nn.Module, e.g. {path}:build")
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise UserInputError(f"{path} is a folder without config.json, which is no Hugging Face model folder; "
                                 f"give one of: {'; '.join(SUPPORTED)}")
        if sample is not None:
            raise UserInputError("--sample is read for TorchScript and Python factory sources only; a Hugging Face "
                                 "folder's config.json gives its inputs")
        draft = hf_draft(path.absolute(), out)
    elif path.suffix.lower() in ONNX_SUFFIXES:
        if sample is not None:
            raise UserInputError("--sample is read for TorchScript and Python factory sources only; an ONNX graph "
                                 "declares its inputs")
        draft = onnx_draft(path.absolute(), out)
    elif path.suffix.lower() in TORCHSCRIPT_SUFFIXES:
        draft = torchscript_draft(path.absolute(), out, sample)
    else:
        raise UserInputError(f"{path}: not a kind of model init reads (by its suffix); give one of: "
                             f"{'; '.join(SUPPORTED)}")
    if name is not None:
        draft.name = Value(name)
    extra = [out.parent / f for f in draft.extra_files]
    for file in extra:
        _refuse_existing(file, force)
    result = InitResult(path=out, kind=draft.kind, not_inferred=list(draft.not_inferred), written=written + extra)
    spec_text = render(draft, result)
    if name is not None:  # given, not read
        result.inferred.pop("name", None)
    _check_loads(spec_text, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for file, body in [(out, spec_text)] + [(out.parent / f, t) for f, t in draft.extra_files.items()]:
        with open(file, "w" if force else "x", encoding="utf-8") as handle:
            handle.write(body)
    return result


def _refuse_existing(path: Path, force: bool) -> None:
    if path.is_dir():
        raise UserInputError(f"--out {path} is a folder; give the spec file's path, e.g. {path / 'spec.yaml'}")
    if path.exists() and not force:
        raise UserInputError(f"{path} already exists; pass --force to overwrite it (nothing was written)")


def _check_loads(text: str, out: Path) -> None:
    """The draft through the project's own spec parser, before a byte is written: a draft that does
    not load is a bug of init's, never the user's."""
    import yaml


    try:
        parse_spec(yaml.safe_load(text), out)
    except UserInputError as exc:
        raise InternalError(f"init drafted a spec that does not load: {exc}") from None
