"""What to send: request inputs for any served model, without writing code.

Sources, in order of preference:

1. a payload ``.npz`` the user names: either a version's ``reference.npz`` (keys
   ``input/<case>/<input name>``) or a plain file keyed by input name (validation data; other keys,
   e.g. ``labels``, are ignored), rows along the first axis when the model batches;
2. the latest version's ``reference.npz`` in the repository: its validation cases alone where it has
   any (case keys ``<n>_val_b<batch>``, ``<n>_val``: builder/accuracy/tensors.py ``build_cases``), else all
   its cases. The generated ones hold random values over each input's value_range, at every dynamic
   size the build checked: sent to a server in production they fill its drift windows with data
   that is not its traffic, and the drift alerts fire for minutes. The source says which
   (``load_samples``); loadtest gets a copy with the validation cases only (``default_payload``);
3. generated from the model's own metadata and config as Triton reports them
   (``/v2/models/NAME``, ``/config``): floats uniform in [0, 1), integers zero, dynamic dims 16, short
   ASCII sentences for a text (BYTES) input.

A Hugging Face pipeline ensemble (text in: builder/repository/layout.py ``is_pipeline``) takes the texts
of its latest version's ``pipeline_reference.json`` in place of 2 (its model step's reference.npz holds
token ids, not texts); Locust reads them from a copy written as a string .npz (``default_payload``).
Text inputs travel as BYTES: a payload .npz holds them as a numpy unicode (or bytes) array, never as
objects (builder/tuning/text_payload.py).

loadtest/locustfile.py reads the same two ``.npz`` layouts by itself (it must run on worker
machines that do not have this package).

Usage::

    model = fetch_model("127.0.0.1:8001", "grpc", "digits_cnn")   # ServerError if not ready
    samples = load_samples(model, payload=None, repository="model_repository")
    requests = make_requests(samples, batch_size=1)                 # list of {input: array}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builder.accuracy.tensors import to_wire
from builder.core.errors import ServerError, UserInputError
from builder.core.scratch import OwnedFolder, sweep
from builder.repository.layout import (is_pipeline, latest_version, model_dir, not_in_repository,
                                       require_model_repository)
from builder.serving.client import TritonClient
from builder.tuning.text_payload import (BYTES, as_bytes, generated_text_array, model_step_samples, pipeline_texts,
                                         write_texts_npz)

#: Triton datatype (metadata spelling) -> numpy dtype.
DATATYPES = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
             "INT16": np.int16, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}
GENERATED_DYNAMIC_SIZE = 16
MAX_SAMPLES = 256
VALIDATION_CASE = re.compile(r"^\d+_val(_|$)")  # a reference.npz case key (<index>_<case id>) of data.validation
COPY_PREFIX = "triton-builder-payload-"  # default_payload's copies, in the temp dir (builder/core/scratch.py)
_COPIES = None  # the OwnedFolder of this process's copies, made on first use


@dataclass
class ModelInterface:
    name: str
    inputs: list[tuple[str, str, list[int]]]  #: (name, datatype, per-sample shape) - batch dim removed
    outputs: list[str]
    max_batch_size: int
    config: dict[str, Any]  #: the config Triton loaded (JSON form)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0


def fetch_model(url: str, protocol: str, model: str, timeout: float = 10.0) -> ModelInterface:
    """The model's inputs/outputs and config as the running server reports them.

    Raises ``ServerError`` (exit 2) if the server cannot be reached or the model is not ready.
    """

    if protocol not in ("http", "grpc"):
        raise UserInputError(f"--protocol {protocol!r}: use http or grpc")
    with TritonClient(url, protocol, network_timeout=timeout) as client:
        client.require_live("is it running, and is that its " + protocol.upper() + " port?")
        try:
            ready = client.model_ready(model)
        except ServerError:
            ready = False
        if not ready:
            try:  # a model the server tried and failed: its reason, not advice to load it
                state, reason = client.model_state(model)
            except ServerError:
                state, reason = None, ""
            if state is not None:
                raise ServerError(f"model '{model}' is not ready on Triton at {url} (state {state}: "
                                  f"{' '.join(reason.split())[:400] or 'no reason given'}); fix it and restart the "
                                  "server (or load it again), then retry")
            raise ServerError(f"model '{model}' is not ready on Triton at {url}; load it first "
                              "(triton-builder serve loads every model of the repository)")
        meta, config = client.model_metadata(model), client.model_config(model)
    max_batch = int(config.get("max_batch_size", 0))
    inputs = []
    for item in meta["inputs"]:
        shape = [int(d) for d in item["shape"]]
        inputs.append((item["name"], item["datatype"], shape[1:] if max_batch > 0 else shape))
    return ModelInterface(model, inputs, [o["name"] for o in meta["outputs"]], max_batch, config)


def check_batch_size(model: ModelInterface, batch_size: int) -> None:
    """Refuse, before a run, a ``--batch-size`` the model cannot take: every request would fail."""
    rows_per_request = max(model.max_batch_size, 1)
    if batch_size > rows_per_request:
        raise UserInputError(f"--batch-size {batch_size}: model '{model.name}' takes at most {rows_per_request} "
                             f"row(s) per request (max_batch_size {model.max_batch_size}); give --batch-size <= "
                             f"{rows_per_request}")


def default_payload(repository: str | Path | None, model: str, text_input: str = "text") -> Path | None:
    """The payload file a load test sends by default: the latest version's reference.npz, or where it
    holds validation cases beside generated ones, a copy with those alone (the module doc says why),
    ``<temp>/triton-builder-payload-*/<model>-v<version>-validation-cases/reference.npz``, removed when
    this process ends. For a text pipeline ensemble: its reference texts as ``text_input`` in a string .npz,
    ``<temp>/triton-builder-payload-*/<model>-v<version>-texts/texts.npz``."""
    texts = _pipeline_texts(repository, model)
    if texts is not None:

        return write_texts_npz(_owned_path(f"{model}-v{texts[1].parent.name}-texts/texts.npz"), text_input, texts[0])
    path = reference_payload(repository, model)
    cases, _ = payload_cases(path) if path is not None else (None, "")
    if cases is None or len(cases) == len(_case_keys(path)):
        return path
    return _validation_copy(path, cases, f"{model}-v{path.parent.name}-validation-cases")



def locust_payload(model: ModelInterface, payload: str | Path | None,
                   repository: str | Path | None) -> tuple[Path | None, str]:
    """The file Locust reads (None: it generates inputs) and where its samples come from, checked as
    ``load_samples`` checks them: the source names the reference.npz whose validation cases are sent,
    not the temporary copy of them (``default_payload``) that Locust reads."""
    if payload is not None:
        path = Path(payload).resolve()
        return path, load_samples(model, path)[1]
    source = load_samples(model, None, repository)[1]
    texts = [name for name, datatype, _ in model.inputs if datatype == "BYTES"]
    return default_payload(repository, model.name, *texts[:1]), source


def _pipeline_texts(repository: str | Path | None, model: str) -> tuple[list[str], Path] | None:
    return pipeline_texts(repository, model)

def reference_payload(repository: str | Path | None, model: str) -> Path | None:
    """The latest version's reference.npz in ``repository``, if there is one. A ``repository`` given
    that is not one (a model folder, a typo) or lacks ``model`` is refused: falling back to generated
    inputs would load-test with other data than the user pointed at."""
    if repository is None:
        return None

    root = require_model_repository(Path(repository))
    folder = model_dir(root, model)
    if not (folder / "config.pbtxt").is_file():
        raise not_in_repository(model, root)
    if is_pipeline(root, model):  # its model step's reference.npz holds token ids, not the ensemble's texts
        return None
    version = latest_version(folder)
    if version is None:
        return None
    path = folder / str(version) / "reference.npz"
    return path if path.is_file() else None


def _case_keys(path: Path) -> list[str]:
    """The cases of a reference.npz (keys ``input/<case>/<name>``); [] for another .npz or an unreadable one
    (read_npz_samples names what is wrong with it)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return sorted({key.split("/")[1] for key in archive.files if key.startswith("input/") and key.count("/") > 1})
    except Exception:  # noqa: BLE001 - reported when it is read
        return []


def payload_cases(path: Path) -> tuple[list[str] | None, str]:
    """The cases of the default payload ``path`` to send (None: all) and how to say where the samples come
    from: the validation cases where it has any, else every case, with the warning that they move drift."""
    cases = _case_keys(path)
    validation = [case for case in cases if VALIDATION_CASE.match(case)]
    if validation:
        left = len(cases) - len(validation)
        return validation, (f"the {len(validation)} validation case(s)"
                            + (f" (its {left} generated case(s) left out)" if left else "") + f" of {path}")
    if not cases:
        return None, str(path)
    return None, (f"generated inputs, which may move the server's drift gauges (the build had no validation data; "
                  f"give --payload to send your own): all {len(cases)} case(s) of {path}")


def _validation_copy(path: Path, cases: list[str], name: str) -> Path:
    """``path`` with the input arrays of ``cases`` alone, in a folder this process owns (removed at exit;
    one a dead process left is removed by the next)."""
    import os

    target = _owned_path(f"{name}/reference.npz")
    target.parent.mkdir(parents=True, exist_ok=True)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files
                  if key.startswith("input/") and key.split("/", 2)[1] in cases}
    with open(target.with_suffix(".tmp"), "wb") as out:
        np.savez_compressed(out, **arrays)
    os.replace(target.with_suffix(".tmp"), target)
    return target


def _owned_path(relative: str) -> Path:
    """``relative`` in this process's folder of payload copies (removed at exit; one a dead process left
    is removed by the next)."""
    import atexit
    import tempfile


    global _COPIES
    if _COPIES is None:
        sweep(Path(tempfile.gettempdir()), COPY_PREFIX)
        _COPIES = OwnedFolder.create(Path(tempfile.gettempdir()), COPY_PREFIX)
        atexit.register(_COPIES.release)
    return _COPIES.path / relative


def read_npz_samples(path: str | Path, input_names: list[str], batching: bool,
                     cases: list[str] | None = None) -> list[dict[str, np.ndarray]]:
    """Samples (one request's worth each, batch 1 when the model batches) from a payload .npz; ``cases``:
    those cases of a reference.npz alone."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"--payload {path}: no such file; pass a reference.npz or an .npz keyed by input name")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise UserInputError(f"--payload {path}: not a readable .npz ({exc})") from None
    with archive:
        keys = list(archive.files)
        groups: dict[str, dict[str, np.ndarray]] = {}
        try:  # an array of Python objects raises here, never unpickled
            if any(k.startswith("input/") for k in keys):  # reference.npz: input/<case>/<name>
                for key in keys:
                    kind, case, name = (key.split("/", 2) + ["", ""])[:3]
                    if kind == "input" and (cases is None or case in cases):
                        groups.setdefault(case, {})[name] = archive[key]
            else:
                groups["all"] = {key: archive[key] for key in keys}
        except Exception as exc:  # noqa: BLE001 - numpy's object-array ValueError, a damaged member
            raise UserInputError(f"--payload {path}: not a plain .npz of numbers or strings "
                                 f"({str(exc).splitlines()[0][:200]}); it is never unpickled: save arrays of numbers, "
                                 "and texts as numpy string arrays (np.array(['a text', ...]), not dtype=object)") from None
    samples: list[dict[str, np.ndarray]] = []
    for case in sorted(groups):
        arrays = groups[case]
        missing = [n for n in input_names if n not in arrays]
        if missing:
            raise UserInputError(f"--payload {path}: no array for input(s) {', '.join(missing)} "
                                 f"(it has: {', '.join(sorted(arrays)) or 'nothing'}); key the arrays by input name")
        if not batching:
            samples.append({n: arrays[n] for n in input_names})
            continue
        rows = min(len(arrays[n]) for n in input_names)
        samples += [{n: arrays[n][i:i + 1] for n in input_names} for i in range(rows)]
    if not samples:
        raise UserInputError(f"--payload {path}: holds no rows")
    if len(samples) > MAX_SAMPLES:  # spread over the file rather than only its start
        picks = np.linspace(0, len(samples) - 1, MAX_SAMPLES).astype(int)
        samples = [samples[i] for i in picks]
    return samples


def generated_samples(model: ModelInterface, count: int = 16, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Inputs made from the model's metadata: right names, dtypes and shapes, never all zeros for floats;
    short ASCII sentences for a text (BYTES) input, one per element (its dynamic dims 1)."""

    rng = np.random.default_rng(seed)
    samples = []
    for index in range(count):
        sample = {}
        for name, datatype, shape in model.inputs:
            if datatype == BYTES:
                full = ([1] if model.batching else []) + [1 if d < 0 else d for d in shape]
                sample[name] = generated_text_array(full, seed * 1000 + index)
                continue
            if datatype not in DATATYPES:
                raise UserInputError(f"model '{model.name}' input '{name}' has datatype {datatype}, which "
                                     "cannot be generated; pass --payload with an .npz holding it")
            dims = [GENERATED_DYNAMIC_SIZE if d < 0 else d for d in shape]
            full = ([1] if model.batching else []) + dims
            dtype = DATATYPES[datatype]
            if np.issubdtype(dtype, np.floating):
                sample[name] = rng.random(full).astype(dtype)
            else:
                sample[name] = np.zeros(full, dtype)
        samples.append(sample)
    return samples


def load_samples(model: ModelInterface, payload: str | Path | None = None,
                 repository: str | Path | None = None) -> tuple[list[dict[str, np.ndarray]], str]:
    """Samples and where they came from: the payload, else reference.npz (its validation cases alone where
    it has any: ``payload_cases``), else generated."""
    names = [name for name, _, _ in model.inputs]
    texts = _pipeline_texts(repository, model.name) if payload is None else None
    if texts is not None:
        return _text_samples(model, texts[0]), f"the {len(texts[0])} texts of {texts[1]}"
    tokenized = model_step_samples(repository, model.name, names) if payload is None else None
    if tokenized is not None:  # a text pipeline's model step: the shapes the tokenizer step really sends
        return tokenized
    path = Path(payload) if payload is not None else reference_payload(repository, model.name)
    if path is not None:
        cases, source = payload_cases(path) if payload is None else (None, str(path))
        dims = {name: shape for name, _, shape in model.inputs}
        samples = read_npz_samples(path, names, model.batching, cases)
        samples = _as_model_dtypes(samples, {name: datatype for name, datatype, _ in model.inputs}, path)
        # a scalar per sample travels as dims [1] (config reshape []): shape the rows the way Triton wants
        samples = [{n: to_wire(a, dims[n], model.batching) for n, a in sample.items()} for sample in samples]
        _check_shapes(samples, dims, model.batching, path)
        return samples, source
    return generated_samples(model), "generated from the model's metadata"


def _text_samples(model: ModelInterface, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """One sample per text for the pipeline ensemble's one text input."""

    inputs = [(name, shape) for name, datatype, shape in model.inputs if datatype == BYTES]
    if len(model.inputs) != 1 or not inputs:
        raise UserInputError(f"model '{model.name}' is a text pipeline but takes {[n for n, _, _ in model.inputs]}; "
                             "give --payload with an .npz keyed by its input names")
    name, _ = inputs[0]
    rows = [np.array([[text]] if model.batching else [text], dtype=str) for text in texts[:MAX_SAMPLES]]
    return [{name: as_bytes(row, name)} for row in rows]


def _as_model_dtypes(samples: list[dict[str, np.ndarray]], datatypes: dict[str, str],
                     path: Path) -> list[dict[str, np.ndarray]]:
    """Payload arrays in the dtypes the model takes: a cast within a kind (numpy's float64 default for
    an FP32 input) is made; across kinds (floats for INT64 ids) it is refused here, not as every request
    of a run failing on the server."""

    first = samples[0] if samples else {}
    texts = [name for name in first if datatypes.get(name) == BYTES]
    if texts:  # strings in the .npz (unicode or bytes) -> the object arrays of bytes tritonclient sends
        samples = [{n: as_bytes(a, f"{path.name}['{n}']") if n in texts else a for n, a in sample.items()}
                   for sample in samples]
        first = samples[0]
    for name, array in first.items():
        expected = DATATYPES.get(datatypes.get(name, ""))
        if expected is None or array.dtype == expected:
            continue
        if not np.can_cast(array.dtype, expected, casting="same_kind"):
            raise UserInputError(f"{path.name}['{name}'] is {array.dtype}, the model takes {datatypes[name]} "
                                 f"({np.dtype(expected).name}): save the payload's '{name}' as {np.dtype(expected).name}")
    return [{n: a.astype(DATATYPES[datatypes[n]], copy=False) if datatypes.get(n) in DATATYPES else a
             for n, a in sample.items()} for sample in samples]


def _check_shapes(samples: list[dict[str, np.ndarray]], dims: dict[str, list[int]], batching: bool,
                  path: Path) -> None:
    """Each input's per-sample shape (the batch dim left out when the model batches) against the served
    model's dims (-1: any size): a mismatch is refused here, not as every request of a run failing."""
    for sample in samples:
        for name, array in sample.items():
            found = list(array.shape[1:] if batching else array.shape)
            expected = dims.get(name)
            if expected is None:
                continue
            if len(found) != len(expected) or any(e != -1 and e != f for e, f in zip(expected, found)):
                rows = " per row" if batching else ""
                wildcard = " (-1: any size)" if -1 in expected else ""
                raise UserInputError(f"{path.name}['{name}'] has shape {found}{rows}, the model takes {expected}"
                                     f"{wildcard}: save the payload's '{name}' with that shape{rows}")


def make_requests(samples: list[dict[str, np.ndarray]], batch_size: int = 1,
                  batching: bool = True) -> list[dict[str, np.ndarray]]:
    """Request inputs of ``batch_size`` rows each, from samples of one row (consecutive, same shape)."""
    if batch_size < 1:
        raise UserInputError(f"--batch-size {batch_size}: must be >= 1")
    if batch_size == 1 or not batching:
        return samples
    requests = []
    for start in range(len(samples)):
        rows = [samples[(start + k) % len(samples)] for k in range(batch_size)]
        first = rows[0]
        rows = [r for r in rows if all(r[n].shape == first[n].shape for n in first)]
        while len(rows) < batch_size:
            rows.append(first)
        requests.append({n: np.concatenate([r[n] for r in rows]) for n in first})
    return requests
