"""The user's model as stage load reads it: a factory imported from the spec's folder, weights in a
state_dict file, and checks that the model can be the reference (deterministic). Every failure of the
user's code or files is a UserInputError naming the file, the line where there is one, and the fix.

Usage::

    model, files = import_factory("model:build", spec_dir, origin="spec.yaml")  # files: model.py, ...
    load_weights(model, Path("weights.safetensors"))
"""

from __future__ import annotations

import functools
import importlib
import sys
import traceback
import zipfile
from pathlib import Path
from typing import Mapping

from builder.accuracy.tensors import compare_outputs
from builder.core.errors import UserInputError
from builder.optimise.onnx_tools import external_tensors


def _where_in_user_code(exc: BaseException, folder: Path, default: str) -> str:
    """'helpers.py line 3' for the deepest frame of the traceback in the user's folder, else default."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _inside(Path(f.filename), folder)]
    if not frames:
        return default
    return f"{Path(frames[-1].filename).resolve().relative_to(folder.resolve())} line {frames[-1].lineno}"


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except (ValueError, OSError):
        return False
    return True


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:400] or type(exc).__name__


# the user's modules import_factory loaded, which it may drop for another spec's module of the same
# name; every other entry of sys.modules is triton-builder's or a library's, and never dropped
_USER_MODULES: set[str] = set()


@functools.cache  # scanning every distribution's metadata takes a few tenths of a second
def _installed_top_level() -> Mapping[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _shadowed(top: str) -> str | None:
    """What a user's module named ``top`` would replace for the rest of this process, or None:
    triton-builder's own package (its modules then failed to import: "'builder' is not a package"),
    an installed package (imported later by the build: onnx at export) or a module already imported."""
    if top == __name__.split(".")[0]:
        return "triton-builder's own package"
    if top in _installed_top_level():
        return f"the installed package '{top}' (from {', '.join(sorted(set(_installed_top_level()[top])))})"
    if top in sys.modules and top not in _USER_MODULES:
        found = getattr(sys.modules[top], "__file__", None)
        return f"the module '{top}' this process already uses ({found or 'built into Python'})"
    return None


def import_factory(ref: str, spec_dir: Path, origin: str) -> tuple:
    """The torch.nn.Module that `ref` ("python.module:callable") returns, in eval mode, and the source
    files it came from (the factory's module, and the spec folder's modules this import loaded), for
    the version's provenance. The user's code runs here: whatever it raises, even SystemExit, ends the
    build as a UserInputError, never as a traceback or a silent exit."""
    import torch

    module_name, attr = ref.split(":")
    top = module_name.split(".")[0]
    file = f"{module_name.replace('.', '/')}.py"
    field = f"{origin}: field 'source.module'"
    search = [str(spec_dir), str(Path.cwd())]
    shadowed = _shadowed(top)
    if shadowed is not None:  # before anything is imported or dropped: the build itself would break
        what, renamed = (f"{top}.py", f"{top}_model.py") if top == module_name else (f"the folder {top}/",
                                                                                   f"{top}_model/")
        raise UserInputError(f"{field}: '{module_name}' is the name of {shadowed}, which importing the spec's "
                             f"{what} would replace for the whole build; rename {what} to a name of your own "
                             f"(e.g. {renamed}) and set source.module to match ({ref.replace(top, top + '_model', 1)})")
    # two specs may both say "model:build"; drop a cached module of that name from elsewhere (only the
    # user's: dropping triton-builder's own modules broke every later import of them)
    for name in [m for m in sys.modules if (m == top or m.startswith(top + ".")) and m in _USER_MODULES]:
        cached = getattr(sys.modules[name], "__file__", None) or ""
        if not cached.startswith(str(spec_dir)):
            del sys.modules[name]
    sys.path[:0] = search
    before = set(sys.modules)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and missing != module_name and not module_name.startswith(missing + "."):
            # the module was found; something it imports was not
            where = _where_in_user_code(exc, spec_dir, file)
            raise UserInputError(
                f"{field}: {where} imports '{missing}', which is not installed in this environment "
                f"({sys.executable}); install it there, or remove the import") from None
        raise UserInputError(
            f"{field}: cannot import '{module_name}' ({exc}); the spec folder "
            f"{spec_dir} is importable, so put {file} there") from None
    except SyntaxError as exc:
        name = exc.filename and Path(exc.filename).name or file
        if exc.filename and _inside(Path(exc.filename), spec_dir):
            name = str(Path(exc.filename).resolve().relative_to(spec_dir.resolve()))
        raise UserInputError(f"{field}: {name} line {exc.lineno}: {type(exc).__name__}: {exc.msg}; fix the "
                             "syntax") from None
    except SystemExit as exc:
        raise UserInputError(f"{field}: importing {file} exited (SystemExit {exc.code}); a model file must not "
                             "call sys.exit() or exit() at import (guard scripts with if __name__ == '__main__':)"
                             ) from None
    except Exception as exc:  # noqa: BLE001 - the user's code: say where it failed, without a traceback
        where = _where_in_user_code(exc, spec_dir, file)
        raise UserInputError(f"{field}: importing {file} raised {type(exc).__name__} at {where}: {_one_line(exc)}; "
                             f"fix {file} so that it imports") from None
    finally:
        for path in search:
            sys.path.remove(path)
        _USER_MODULES.update(n for n in set(sys.modules) - before if n == top or n.startswith(top + ".")
                             or _inside(Path(getattr(sys.modules.get(n), "__file__", None) or "/"), spec_dir))
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserInputError(f"{field}: '{module_name}' has no callable '{attr}'")
    try:
        model = factory()
    except SystemExit as exc:  # sys.exit() in the factory would end the build with its code, and publish nothing
        raise UserInputError(f"{field}: {ref}() exited (SystemExit {exc.code}); the model factory must return "
                             f"the torch.nn.Module, not call sys.exit() - fix it in {file}") from None
    except Exception as exc:  # noqa: BLE001 - the user's code: say where it failed, without a traceback
        raise UserInputError(f"{field}: {ref}() raised {type(exc).__name__}: "
                             f"{_one_line(exc)}; fix the model factory in {file}") from None
    if not isinstance(model, torch.nn.Module):
        raise UserInputError(f"{field}: {ref}() returned {type(model).__name__}, not a torch.nn.Module")
    loaded = [module] + [sys.modules[n] for n in sorted(set(sys.modules) - before) if n in sys.modules]
    files = [Path(f) for f in dict.fromkeys(getattr(m, "__file__", None) for m in loaded) if f]
    return model.eval(), [f for i, f in enumerate(files) if i == 0 or _inside(f, spec_dir)]


UNSUPPORTED = "unsupported weights format: use .safetensors or a torch.save(state_dict) file"


def weights_format(path: Path) -> str:
    """'safetensors', 'torch' (torch.save's zip archive), 'pickle' (a legacy torch.save or a plain
    pickle: torch.load with weights_only decides) or what else it looks like, read from the first bytes:
    torch.load takes any file for a pickle, and its complaint would blame "arbitrary objects"."""
    with open(path, "rb") as handle:
        head = handle.read(9)
    size = path.stat().st_size
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            return "a damaged zip archive"
        # torch.save writes <archive>/data.pkl; np.savez writes <key>.npy
        if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "torch"
        if names and all(n.endswith(".npy") for n in names):
            return "a NumPy .npz archive"
        return "a zip archive torch.save did not write"
    if head[:1] == b"\x80":  # a pickle's PROTO opcode
        return "pickle"
    header = int.from_bytes(head[:8], "little") if len(head) == 9 else 0
    if head[8:9] == b"{" and 8 + header <= size:  # safetensors: u64 header length, then its JSON
        return "safetensors"
    return "empty" if size == 0 else "not a weights file this tool reads"


def load_weights(model, path: Path) -> None:
    import torch

    kind = weights_format(path)
    if path.suffix == ".safetensors" or kind == "safetensors":
        from safetensors.torch import load_file
        try:
            state = load_file(str(path))
        except Exception as exc:  # noqa: BLE001
            raise UserInputError(f"source.weights: {path} is not a valid safetensors file ({exc})") from None
    elif kind in ("torch", "pickle"):
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - UnpicklingError and friends
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserInputError(
                f"source.weights: {path} holds more than plain tensors (a pickle of arbitrary objects), which "
                f"is never unpickled ({first[:200]}). Save the state_dict with safetensors "
                "(safetensors.torch.save_file(model.state_dict(), 'weights.safetensors')) or torch.save(model.state_dict())"
            ) from None
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
    else:
        raise UserInputError(f"source.weights: {path} is {kind}: {UNSUPPORTED}")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserInputError(f"source.weights: {path} is not a state_dict (a mapping of names to tensors)")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:600].rstrip(".")  # torch ends its text with '.' already
        raise UserInputError(
            f"source.weights: {path.name} does not fit the module: {detail}. Use the weights saved from this "
            "architecture, or fix source.module"
        ) from None


#: rel L2 between two runs on the same inputs above which a model is not deterministic (the same
#: process and thread count: a deterministic model repeats itself to the bit, or nearly)
DETERMINISM_REL_L2 = 1e-6


def check_deterministic(first: dict, second: dict, origin: str, kind: str = "module") -> None:
    """Refuse a model whose two runs on the same inputs differ: every variant would be compared with
    one draw of its randomness and fail verification at rel L2 ~1, which blames the variants."""

    for name, m in compare_outputs(first, second).items():
        if "shape_mismatch" in m:
            how = f"output '{name}' has shape {m['expected']}, then {m['got']}"
        elif "nonfinite_mismatch" in m:
            how = f"output '{name}' has NaN/Inf at other places"
        elif m.get("mismatched") or m.get("rel_l2", 0.0) > DETERMINISM_REL_L2:
            how = f"output '{name}': rel L2 {m['rel_l2']:.1e}" + (
                f", {m['mismatched']:.0f} values differ" if m.get("mismatched") else "")
        else:
            continue
        fix = ("random ops in the graph (RandomNormal, RandomUniform, Multinomial, Dropout with training_mode); "
               "export it in eval mode without them" if kind == "onnx" else
               "dropout with training=True or random ops in forward(); make forward() deterministic in eval mode")
        raise UserInputError(f"{origin}: field 'source': the model is not deterministic: two runs on the same inputs "
                             f"differ ({how}) - {fix}")


# a sample's answer alone vs inside a batch, per output dtype. Measured on CPU: fp32 kernels for
# other batch sizes move an answer by rel L2 <= 3e-7 (examples/digits, convnet64; bert_tiny 0), so
# 1e-4 is ~300x that noise and still refuses a 0.5 % leak (y = h + 0.005 * h.mean(0)); float16
# outputs round at ~1e-3, hence 1e-2. Above that bar a difference is still forgiven when the
# sample batched with copies of itself (nothing to leak) differs from its lone run about as much:
# that is the model's own batch-size noise (e.g. TF32 or half kernels on a GPU inside forward()),
# up to the float16 bar at most, so a mixing model cannot hide behind noisy kernels.
BATCH_INDEPENDENCE_REL_L2 = {"float16": 1e-2}
BATCH_INDEPENDENCE_REL_L2_DEFAULT = 1e-4
BATCH_INDEPENDENCE_NOISE_CEILING = 1e-2
BATCH_NOISE_MARGIN = 10.0


def batch_independence_limit(dtype) -> float:
    return BATCH_INDEPENDENCE_REL_L2.get(str(dtype), BATCH_INDEPENDENCE_REL_L2_DEFAULT)


def _own_batch_noise(run, inputs: dict, i: int, batch: int, alone: dict) -> dict[str, float]:
    """rel L2 per output between sample ``i`` alone and at row ``i`` of a batch of its own copies:
    the same batch size and position, so the same kernels, but no other sample to depend on (a mean
    over copies is the sample itself)."""
    import numpy as np


    copies = run({name: np.repeat(array[i:i + 1], batch, axis=0) for name, array in inputs.items()})
    return {name: m.get("rel_l2", 0.0)
            for name, m in compare_outputs({k: v[i:i + 1] for k, v in copies.items()}, alone).items()}


def check_batch_independent(run, inputs: dict, outputs: dict, origin: str) -> None:
    """Refuse a model whose answer for a sample depends on the other samples of its batch: with
    max_batch_size > 0 Triton joins requests from different clients into one batch, so each client
    would get an answer that depends on strangers' inputs (softmax or a normalisation over dim 0, the
    batch, is the usual cause). The first, middle and last samples of ``inputs`` (a batch of 2 or
    more; ``outputs`` its answers) run alone. A class id flipping on one sample can be a near tie, so
    integer outputs count only when two samples disagree. A float output may move by its dtype's bar
    (batch_independence_limit), or by 10x what a batch of the sample's own copies moves it."""

    batch = len(next(iter(inputs.values())))
    found: list[str] = []
    integer_samples = 0
    for i in sorted({0, batch // 2, batch - 1}) if batch > 1 else []:
        alone = run({name: array[i:i + 1] for name, array in inputs.items()})
        noise: dict[str, float] | None = None
        for name, m in compare_outputs({k: v[i:i + 1] for k, v in outputs.items()}, alone).items():
            if "shape_mismatch" in m or "nonfinite_mismatch" in m:
                found.append(f"output '{name}' of sample {i}: {'shape' if 'shape_mismatch' in m else 'NaN/Inf'} "
                             "differs")
            elif m.get("mismatched"):
                integer_samples += 1
                found.append(f"output '{name}' of sample {i}: {m['mismatched']:.0f} value(s) differ")
            elif m.get("rel_l2", 0.0) > batch_independence_limit(outputs[name].dtype):
                noise = _own_batch_noise(run, inputs, i, batch, alone) if noise is None else noise
                allowed = min(BATCH_INDEPENDENCE_NOISE_CEILING, BATCH_NOISE_MARGIN * noise.get(name, 0.0))
                if m["rel_l2"] > allowed:
                    found.append(f"output '{name}' of sample {i}: rel L2 {m['rel_l2']:.1e} ({noise.get(name, 0.0):.1e} "
                                 f"in a batch of its own copies), max abs {m['max_abs']:.1e}")
    if found and (integer_samples != len(found) or integer_samples >= 2):
        raise UserInputError(
            f"{origin}: field 'max_batch_size': the model's answer for a sample depends on the other samples of its "
            f"batch (alone vs in a batch of {batch}: {'; '.join(found[:3])}). Triton batches requests from "
            "different clients together, so each would get an answer that depends on the others. Compute each "
            "sample on its own (e.g. softmax/normalise over dim=-1, not dim=0, the batch; an LSTM, GRU or "
            "TransformerEncoder given [batch, time, ...] needs batch_first=True, as batch_first=False reads the batch "
            "as time, and their h_n/c_n are [layers, batch, hidden] even then: return h_n.transpose(0, 1)); if the "
            "first dimension is a set the model needs whole, set max_batch_size: 0 and give that "
            "dimension in inputs[].shape (-1)")


def check_onnx_external_data(model, path: Path) -> list[Path]:
    """The external data files an ONNX source refers to (each once, in order), checked now: every one
    must be a file inside the model's folder (onnx refuses any other, and the build copies them from
    there) and hold the bytes the model says it does. A missing file would otherwise fail deep in export."""

    folder = path.parent.resolve()
    files: list[Path] = []
    for tensor in external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        target = (folder / location).resolve()
        if not location or Path(location).is_absolute() or not _inside(target, folder):
            raise UserInputError(
                f"source.onnx: {path.name} keeps tensor '{tensor.name}' in {location!r}, outside its folder "
                f"{folder}; move the data file into that folder (or below it) and save the model again with "
                "onnx.save_model(model, path, save_as_external_data=True, location='<file name>')")
        if not target.is_file():
            what = "is a directory" if target.is_dir() else "does not exist"
            raise UserInputError(f"source.onnx: {path.name} keeps tensor '{tensor.name}' in the external data file "
                                 f"{location}, which {what} in {folder}; put that file there (it travels with "
                                 f"{path.name})")
        end = int(info.get("offset") or 0) + int(info.get("length") or 0)
        if end > target.stat().st_size:
            raise UserInputError(f"source.onnx: {location} holds {target.stat().st_size} bytes but {path.name} reads "
                                 f"tensor '{tensor.name}' up to byte {end}; it is not that model's data file: save "
                                 "the model and its data again together")
        if target not in files:
            files.append(target)
    return files


def forward_parameters(model) -> tuple[list[str], int, bool] | None:
    """(names of forward()'s positional parameters, how many of them are required, whether it also
    takes *args) of an eager or TorchScript module; None where the signature cannot be read."""
    import inspect

    schema = getattr(getattr(model, "forward", None), "schema", None)
    if schema is not None:  # TorchScript: the compiled schema (its first argument is self)
        arguments = [a for a in schema.arguments[1:] if not a.kwarg_only]
        return [a.name for a in arguments], sum(not a.has_default_value() for a in arguments), False
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in signature.parameters.values() if p.kind in kinds]
    required = sum(p.default is inspect.Parameter.empty for p in positional)
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())
    return [p.name for p in positional], required, varargs
