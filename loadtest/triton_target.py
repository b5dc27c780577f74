"""What loadtest/locustfile.py sends: the model's inputs read from the server, the request payloads
(``--payload`` .npz, else generated; a text (BYTES) input takes a numpy string array from the .npz, or
generated short ASCII sentences, sent as UTF-8 bytes) and the tritonclient for ``--triton-protocol``. Plain Python, no
Locust: the locustfile builds one ``Target`` per process (workers too) and each user its own client.

    target = Target(options, "127.0.0.1:8000")     # options: --triton-model, --triton-protocol, --payload ...
    requests = target.requests()                   # [(InferInput list, InferRequestedOutput list)] per sample
    module, client = _client(target.protocol, target.host, target.timeout)
"""

import functools

import numpy as np

DATATYPES = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
             "INT16": np.int16, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}
MAX_SAMPLES = 256
_PHRASES = ("the service was quick and friendly", "delivery took far too long", "great value for the price",
            "the screen cracked after a week", "a calm and pleasant evening", "support never answered my email",
            "fresh bread every morning", "the battery lasts all day", "noisy room next to the lift",
            "easy to set up in minutes", "the food arrived cold", "would happily come back again")


def _address(host):
    host = (host or "").strip().rstrip("/")
    for scheme in ("http://", "https://", "grpc://"):
        if host.startswith(scheme):
            host = host[len(scheme):]
    return host


def _client(protocol, host, timeout):
    if protocol == "grpc":
        import tritonclient.grpc as module

        return module, _grpc_client_class(module)(host)
    import tritonclient.http as module

    return module, module.InferenceServerClient(host, connection_timeout=timeout, network_timeout=timeout)


@functools.cache  # one subclass per process
def _grpc_client_class(module):
    """tritonclient's gRPC client closes its channel again in __del__. Run by the garbage collector
    at exit, after Locust printed "Shutting down", that close blocked forever now and then (seen with
    faulthandler: the main thread in grpc Channel._close under "Garbage-collecting"; the run was only
    ended by the hard timeout). Every client here is closed explicitly (the pre-run checks, on_stop,
    and _close_left_clients at quit), so collecting one does nothing."""
    class ClosedExplicitly(module.InferenceServerClient):
        def __del__(self):
            pass

    return ClosedExplicitly


def _read_npz(path, names, batching):
    with np.load(path, allow_pickle=False) as archive:
        groups = {}
        for key in archive.files:
            if key.startswith("input/"):  # reference.npz: input/<case>/<name>
                _, case, name = key.split("/", 2)
                groups.setdefault(case, {})[name] = archive[key]
            elif not key.startswith("output/"):
                groups.setdefault("", {})[key] = archive[key]
    samples = []
    for case in sorted(groups):
        arrays = groups[case]
        missing = [n for n in names if n not in arrays]
        if missing:
            raise ValueError(f"--payload {path}: no array for input(s) {', '.join(missing)} "
                             f"(it has: {', '.join(sorted(arrays))}); key the arrays by input name")
        if batching:
            samples += [{n: arrays[n][i:i + 1] for n in names} for i in range(min(len(arrays[n]) for n in names))]
        else:
            samples.append({n: arrays[n] for n in names})
    if not samples:
        raise ValueError(f"--payload {path}: holds no rows")
    picks = np.linspace(0, len(samples) - 1, min(len(samples), MAX_SAMPLES)).astype(int)
    return [samples[i] for i in picks]


def _as_bytes(array, name):
    """A text input's array (numpy unicode or bytes from the .npz) as the object array of UTF-8 bytes
    tritonclient sends as BYTES; numbers refused."""
    array = np.asarray(array)
    if array.dtype.kind == "U":
        values = [v.encode("utf-8") for v in array.reshape(-1).tolist()]
    elif array.dtype.kind == "S" or array.dtype == object:
        values = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1).tolist()]
    else:
        raise ValueError(f"--payload: '{name}' is {array.dtype}, the model takes text (BYTES): save it as a numpy "
                         "string array")
    return np.array(values, dtype=object).reshape(array.shape)


def _as_model_dtypes(samples, inputs):
    """Payload arrays in the model's dtypes, as builder.tuning.payload does: a cast within a kind (numpy's
    float64 default for an FP32 input, int32 ids for INT64); across kinds refused, not sent to fail; text
    (BYTES) inputs as UTF-8 bytes."""
    texts = {name for name, datatype, _ in inputs if datatype == "BYTES"}
    if texts:
        samples = [{n: _as_bytes(a, n) if n in texts else a for n, a in s.items()} for s in samples]
    datatypes = {name: DATATYPES.get(datatype) for name, datatype, _ in inputs}
    for name, array in (samples[0] if samples else {}).items():
        expected = datatypes.get(name)
        if expected is not None and not np.can_cast(array.dtype, expected, casting="same_kind"):
            raise ValueError(f"--payload: '{name}' is {array.dtype}, the model takes {np.dtype(expected).name}")
    return [{n: a.astype(datatypes[n], copy=False) if datatypes.get(n) is not None else a for n, a in s.items()}
            for s in samples]


def _texts(shape, rng):
    """An object array of ``shape`` holding short ASCII sentences (UTF-8 bytes)."""
    count = int(np.prod(shape)) if shape else 1
    texts = []
    for _ in range(count):
        picks = rng.choice(len(_PHRASES), size=int(rng.integers(1, 4)), replace=False)
        texts.append((", ".join(_PHRASES[i] for i in picks).capitalize() + ".").encode("ascii"))
    return np.array(texts, dtype=object).reshape(shape)


def _generate(inputs, batching, count=16):
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(count):
        sample = {}
        for name, datatype, shape in inputs:
            if datatype == "BYTES":  # one short sentence per element, dynamic dims 1
                sample[name] = _texts(([1] if batching else []) + [1 if d < 0 else d for d in shape], rng)
                continue
            if datatype not in DATATYPES:
                raise ValueError(f"input '{name}' has datatype {datatype}; pass --payload with an .npz holding it")
            full = ([1] if batching else []) + [16 if d < 0 else d for d in shape]
            dtype = DATATYPES[datatype]
            floating = np.issubdtype(dtype, np.floating)
            sample[name] = rng.random(full).astype(dtype) if floating else np.zeros(full, dtype)
        samples.append(sample)
    return samples


class Target:
    """The model, its request inputs and the payload's origin; built once per Locust process."""

    def __init__(self, options, host, payload_bytes=None):
        self.model = options.triton_model
        if not self.model:
            raise ValueError("--triton-model is not set: name the model to load-test (or set TRITON_MODEL)")
        if not host:
            raise ValueError("--host is not set: give the Triton address HOST:PORT for --triton-protocol")
        self.protocol, self.host = options.triton_protocol, _address(host)
        self.version = options.triton_model_version or ""
        self.timeout = float(options.triton_timeout_s)
        module, client = _client(self.protocol, self.host, self.timeout)
        try:
            kwargs = {"client_timeout": self.timeout} if self.protocol == "grpc" else {}
            if not client.is_model_ready(self.model, self.version, **kwargs):
                raise ValueError(f"model '{self.model}' is not ready on Triton at {self.host}")
            if self.protocol == "grpc":
                meta = client.get_model_metadata(self.model, self.version, as_json=True, **kwargs)
                config = client.get_model_config(self.model, self.version, as_json=True, **kwargs)["config"]
            else:
                meta = client.get_model_metadata(self.model, self.version)
                config = client.get_model_config(self.model, self.version)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - connection refused, timeouts, ...
            raise ValueError(f"cannot reach Triton at {self.host} over {self.protocol}: {exc}") from None
        finally:
            client.close()
        self.batching = int(config.get("max_batch_size", 0)) > 0
        skip = 1 if self.batching else 0  # metadata shapes include the batch dimension
        inputs = [(i["name"], i["datatype"], [int(d) for d in i["shape"]][skip:]) for i in meta["inputs"]]
        self.outputs = [o["name"] for o in meta["outputs"]]
        names = [name for name, _, _ in inputs]
        if payload_bytes is not None:  # sent by the master
            import io

            samples = _read_npz(io.BytesIO(payload_bytes), names, self.batching)
            self.source = f"{options.payload} (sent by the master)"
        elif options.payload:
            samples, self.source = _read_npz(options.payload, names, self.batching), options.payload
        else:
            samples, self.source = _generate(inputs, self.batching), "the model metadata (generated)"
        samples = _as_model_dtypes(samples, inputs)
        # a scalar per sample travels as dims [1] (config reshape []), as builder.accuracy.tensors.to_wire does
        dims = {name: shape for name, _, shape in inputs}
        scalar = [n for n in names if dims[n] == [1]]
        for sample in samples:
            for n in scalar:
                if sample[n].ndim == (1 if self.batching else 0):
                    sample[n] = sample[n].reshape((len(sample[n]), 1) if self.batching else (1,))
        batch = max(1, int(options.triton_batch_size))
        if batch > max(1, int(config.get("max_batch_size", 0))):
            raise ValueError(f"--triton-batch-size {batch} > the model's max_batch_size "
                             f"{config.get('max_batch_size', 0)}")
        if batch > 1 and self.batching:  # requests of `batch` consecutive rows of equal shapes
            grouped = []
            for i in range(len(samples)):
                rows = [samples[(i + k) % len(samples)] for k in range(batch)]
                if all(r[n].shape == rows[0][n].shape for r in rows for n in names):
                    grouped.append({n: np.concatenate([r[n] for r in rows]) for n in names})
            if not grouped:
                raise ValueError(f"--triton-batch-size {batch}: no {batch} consecutive payload rows have equal shapes")
            samples = grouped
        self.samples = samples
        self.module = module

    def requests(self):
        """(inputs, outputs) tritonclient objects per sample, for this process's protocol."""
        from tritonclient.utils import np_to_triton_dtype

        prepared = []
        for sample in self.samples:
            inputs = []
            for name, value in sample.items():
                item = self.module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
                item.set_data_from_numpy(np.ascontiguousarray(value))
                inputs.append(item)
            prepared.append((inputs, [self.module.InferRequestedOutput(o) for o in self.outputs]))
        return prepared
