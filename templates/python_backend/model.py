"""Triton python-backend model written by triton-builder.

Runs the ONNX file (onnxruntime), TorchScript file (torch) or OpenVINO IR (openvino: model.xml +
model.bin, CPU plugin, latency hint, f32 where the IR is marked so) that sits beside it in the version folder.
Settings come from config.pbtxt parameters:
  model_file        file name in the version folder (model.onnx / model.pt / model.xml)
  runtime           onnxruntime | torchscript | openvino
  intra_op_threads  threads per model instance (default 1: Triton scales with instances)
  scalar_tensors    a model without batching: its scalars (dims [1] on the wire, 0-d for the model)
  intra_op_spinning onnxruntime with several intra-op threads: off (default) | on. Spinning threads
                    busy-wait for work; on a host shared with Triton's frontend, the client or other
                    work they collapse when descheduled (convnet64, 1 x 2 threads, one other busy
                    process: 234 req/s spinning vs 306 not; quiet: 601 vs 627)
Requests that Triton's dynamic batcher groups together are run as one batch when their
per-sample shapes agree, and one by one otherwise (dynamic dims of different sizes).
NaN/Inf in float inputs (non_finite_inputs: count | reject, default count): every request holding
one is counted per input on Triton's metrics endpoint (triton_builder_nonfinite_inputs_total); with
reject it gets an INVALID_ARG error (HTTP 400) naming the input instead of an answer.
Every request answered with an error is counted in triton_builder_request_errors_total (reason
refused | model_error): Triton counts a python-backend response that carries an error as a success
(nv_inference_request_failure stays 0), so the failure-ratio rule adds this counter.
If drift_profile.json and drift.py are present, a sample of the traffic feeds drift gauges on
Triton's own metrics endpoint (see monitoring/README.md). Parameters: drift (on/off), drift_window
(rows, default 512), drift_sample_every (default 1), drift_publish_every (sampled calls, default 64),
drift_observe_rows (batched models: sampled rows gathered before they are binned together, default 64;
binning costs about as much for one row as for 64, ~0.25 ms a call on a 2-core host).
All instances of a model version (one stub process each) share one drift window, a file in /dev/shm
(_SharedWindow), so the gauges cover the last drift_window rows the version served, whichever
instance served them.
"""

import fcntl
import hashlib
import importlib.util
import json
import math
import mmap
import os
import re
import tempfile
import time

import numpy as np
import triton_python_backend_utils as pb_utils


_MODEL_FILES = (("model.onnx", "onnxruntime"), ("model.pt", "torchscript"), ("model.xml", "openvino"))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.model_name = args["model_name"]
        self.version = args["model_version"]
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [(i["name"], pb_utils.triton_string_to_numpy(i["data_type"])) for i in config["input"]]
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]]
        # reshape (Triton's convention for a scalar per sample: dims [1], reshape []): the model sees the
        # reshape, clients send and receive dims
        self.model_shapes = {i["name"]: [int(d) for d in i["reshape"].get("shape", [])]
                             for i in config["input"] if "reshape" in i}
        self.wire_dims = {o["name"]: [int(d) for d in o["dims"]] for o in config["output"] if "reshape" in o}
        # a scalar without batching: Triton refuses reshape [] there, so dims [1] and the names in scalar_tensors
        scalars = set(params.get("scalar_tensors", "").split(","))
        self.model_shapes.update({name: [] for name, _ in self.inputs if name in scalars})
        self.wire_dims.update({name: [1] for name, _ in self.outputs if name in scalars})
        model_file, runtime = params.get("model_file", "model.onnx"), params.get("runtime", "onnxruntime")
        if not os.path.exists(os.path.join(folder, model_file)):
            # a model's versions share one config.pbtxt: a version built as another format has its own file
            present = [(f, r) for f, r in _MODEL_FILES if os.path.exists(os.path.join(folder, f))]
            if len(present) == 1:
                model_file, runtime = present[0]
        path = os.path.join(folder, model_file)
        threads = int(params.get("intra_op_threads", "1") or 1)
        if args.get("model_instance_kind") == "GPU" and runtime != "torchscript":
            raise pb_utils.TritonModelException(f"{model_file}: runtime {runtime} runs on the CPU in the python backend, and this is a KIND_GPU instance: publish a torchscript variant (deploy.instance_kind gpu), or set deploy.instance_kind: cpu")  # noqa: E501
        if runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            spinning = params.get("intra_op_spinning", "off") or "off"
            if spinning not in ("on", "off"):
                raise pb_utils.TritonModelException(f"parameter intra_op_spinning '{spinning}': use on or off")
            options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning == "on" else "0")
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            names = [name for name, _ in self.outputs]
            # clients send every config input; an exporter drops one the model never reads from the graph
            declared = [i.name for i in session.get_inputs()]
            self._run = lambda feeds: dict(zip(names, session.run(names, {n: feeds[n] for n in declared})))
        elif runtime == "torchscript":
            import torch

            torch.set_num_threads(threads)
            # a KIND_GPU instance runs on the GPU Triton gave it; inputs go there, outputs come back
            device = f"cuda:{args['model_instance_device_id']}" if args.get("model_instance_kind") == "GPU" else "cpu"
            # FP32 as verified: torch's default TF32 convolutions put convnet64 1.2e-4 off (fp32 tolerance 1e-5)
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
            module = torch.jit.load(path, map_location=device).eval()
            names = [name for name, _ in self.outputs]
            order = [name for name, _ in self.inputs]

            def run_torch(feeds):
                with torch.inference_mode():
                    result = module(*[torch.from_numpy(np.ascontiguousarray(feeds[n])).to(device) for n in order])
                if isinstance(result, dict) and all(n in result for n in names):
                    result = [result[n] for n in names]  # the spec's own keys, in any order
                return dict(zip(names, (t.cpu().numpy() for t in _tensors(result))))

            self._run = run_torch
        elif runtime == "openvino":
            ov = _import_openvino()

            # the settings the build verified and measured with (builder/optimise/openvino_tools.py): f32 where the IR is
            # marked so (made for this backend), else the CPU plugin's default, as Triton's openvino backend runs it
            core = ov.Core()
            ir = core.read_model(path)
            mark = ["triton_builder", "inference_precision"]
            f32 = ir.has_rt_info(mark) and ir.get_rt_info(mark).astype(str) == "f32"
            compiled = core.compile_model(ir, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                                                      **({"INFERENCE_PRECISION_HINT": "f32"} if f32 else {})})
            request = compiled.create_infer_request()
            order = [name for name, _ in self.inputs]
            ports = [(name, next(p for p in compiled.outputs if name in p.get_names())) for name, _ in self.outputs]

            def run_openvino(feeds):
                result = request.infer({n: np.ascontiguousarray(feeds[n]) for n in order}, share_inputs=False)
                return {name: np.array(result[port]) for name, port in ports}

            self._run = run_openvino
        else:
            raise pb_utils.TritonModelException(f"unknown runtime '{runtime}' (use onnxruntime, torchscript or openvino)")
        instances = sum(int(g.get("count", 1)) * max(1, len(g.get("gpus") or []))
                        for g in config.get("instance_group") or [{}])
        self.drift = _DriftHook.create(folder, self.model_name, self.version, params, self.batching, instances)
        self.errors = _ErrorCounter(self.model_name, self.version)
        self.non_finite = _NonFiniteGuard(self.model_name, self.version, params.get("non_finite_inputs", "count"),
                                          [name for name, dtype in self.inputs if np.issubdtype(dtype, np.floating)])

    def execute(self, requests):
        arrays, refused = [], {}
        for index, request in enumerate(requests):
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy().astype(dtype, copy=False)
                     for name, dtype in self.inputs}
            for name, shape in self.model_shapes.items():
                feeds[name] = feeds[name].reshape(([len(feeds[name])] if self.batching else []) + shape)
            problem = self.non_finite.check(feeds)
            if problem:
                refused[index] = problem
            else:
                arrays.append(feeds)
        results = self._run_grouped(arrays) if arrays else []
        for index in sorted(refused):  # back in request order
            results.insert(index, refused[index])
        responses = []
        for result in results:
            if isinstance(result, _Refused):
                self.errors.count("refused")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_invalid_argument(str(result))))
                continue
            if isinstance(result, Exception):
                self.errors.count("model_error")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(result))))
                continue
            tensors = [pb_utils.Tensor(name, np.ascontiguousarray(self._wire(name, result[name])).astype(dtype, copy=False))
                       for name, dtype in self.outputs]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _wire(self, name, array):
        dims = self.wire_dims.get(name)
        if dims is None:
            return array
        return np.reshape(array, ([len(array)] if self.batching else []) + dims)

    def _run_grouped(self, arrays):
        same_shapes = self.batching and len(arrays) > 1 and all(
            a[name].shape[1:] == arrays[0][name].shape[1:] for a in arrays for name, _ in self.inputs)
        if same_shapes:
            try:
                counts = [len(a[self.inputs[0][0]]) for a in arrays]
                feeds = {name: np.concatenate([a[name] for a in arrays]) for name, _ in self.inputs}
                merged = self._run(feeds)
                self._observe(feeds, merged)
                bounds = np.cumsum([0] + counts)
                return [{k: v[bounds[i]:bounds[i + 1]] for k, v in merged.items()} for i in range(len(arrays))]
            except Exception:  # noqa: BLE001 - fall back to one by one so each request gets its own error
                pass
        results = []
        for feeds in arrays:
            try:
                out = self._run(feeds)
                self._observe(feeds, out)
                results.append(out)
            except Exception as exc:  # noqa: BLE001
                results.append(exc)
        return results

    def _observe(self, feeds, outputs):
        if self.drift is not None:
            self.drift.observe(feeds, outputs)

    def finalize(self):
        if self.drift is not None:
            self.drift.close()
        self.drift = None


def _tensors(result):
    """A TorchScript result as builder/model/runtime.py flatten_outputs takes it: tuples, lists and dict values
    in order, nested ones flattened (an LSTM's (out, (h, c)) is three tensors)."""
    if isinstance(result, dict):
        result = list(result.values())
    if isinstance(result, (list, tuple)):
        return [t for item in result for t in _tensors(item)]
    return [result]


def _import_openvino():
    """import openvino with its usage telemetry declined: openvino_telemetry declines in CI (CI=true),
    checked once while openvino is imported; the variable is restored right after (as the builder's
    builder/optimise/openvino_tools.py import_openvino does)."""
    import sys

    if "openvino" not in sys.modules:
        saved = os.environ.get("CI")
        os.environ["CI"] = "true"
        try:
            import openvino  # noqa: F401
        finally:
            if saved is None:
                os.environ.pop("CI", None)
            else:
                os.environ["CI"] = saved
    return sys.modules["openvino"]


def _invalid_argument(message):
    """A TritonError with code INVALID_ARG (HTTP 400); the stub binds the codes only once it runs."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


class _Refused(Exception):
    """A request refused before running the model (its response carries this text)."""


class _ErrorCounter:
    """triton_builder_request_errors_total{model, version, reason}: the requests answered with an error."""

    REASONS = ("refused", "model_error")

    def __init__(self, model_name, version):
        self._family = pb_utils.MetricFamily(name="triton_builder_request_errors_total",
                                             description="requests the model answered with an error (Triton "
                                                         "counts those as successes)",
                                             kind=pb_utils.MetricFamily.COUNTER)
        self.counters = {reason: self._family.Metric(labels={"model": model_name, "version": str(version),
                                                             "reason": reason})
                         for reason in self.REASONS}

    def count(self, reason):
        self.counters[reason].increment(1)


class _NonFiniteGuard:
    """Counts (and with policy 'reject' refuses) requests whose float inputs hold NaN or Inf."""

    def __init__(self, model_name, version, policy, float_inputs):
        if policy not in ("count", "reject"):
            raise pb_utils.TritonModelException(f"parameter non_finite_inputs '{policy}': use count or reject")
        self.policy, self.model_name = policy, model_name
        family = pb_utils.MetricFamily(name="triton_builder_nonfinite_inputs_total",
                                       description="requests whose input held NaN or Inf values",
                                       kind=pb_utils.MetricFamily.COUNTER)
        self._family = family  # the metrics live as long as their family
        self.counters = {name: family.Metric(labels={"model": model_name, "version": str(version), "input": name,
                                                     "policy": policy})
                         for name in float_inputs}

    def check(self, feeds):
        """None when every float input is finite; else a _Refused (policy reject) or None after counting."""
        bad = []
        for name, counter in self.counters.items():
            values = feeds[name]
            finite = np.isfinite(values)
            if not finite.all():
                counter.increment(1)
                bad.append(f"{name} ({values.size - int(np.count_nonzero(finite))} of {values.size} values)")
        if bad and self.policy == "reject":
            return _Refused(f"model '{self.model_name}' refuses NaN/Inf inputs: {', '.join(bad)} "
                            "(deploy.non_finite_inputs: reject; send finite values)")
        return None


PENDING_BYTES = 4 << 20  # gathered drift rows are binned once they hold this much
# ... or, at the next sampled call, once the first of them waited this long: the instances share one window,
# and the rows one of them is still gathering are missing from what every instance publishes
PENDING_MAX_AGE_S = 1.0


def _log_warning(message):
    logger = getattr(pb_utils, "Logger", None)  # absent outside a stub (tests/unit/test_drift_hook.py)
    if logger is not None:
        logger.log_warn(message)


def _server_key():
    """The tritonserver process that started this stub: its pid and start time (a reused pid is another
    server). Triton starts every stub itself (exec, no shell left between), so instances agree on it."""
    ppid = os.getppid()
    with open(f"/proc/{ppid}/stat", encoding="ascii") as f:
        started = f.read().rsplit(")", 1)[1].split()[19]  # field 22, starttime
    return f"{ppid}_{started}"


class _SharedWindow:
    """The drift window's state in one file that every instance of a model version maps.

    Each instance is its own stub process and receives only part of the traffic: windows of their own
    would each cover ~1/N of the requests, and the gauges they share would show whichever published
    last. The file is named after the tritonserver process (the stubs' parent: its pid and start time,
    so another server's instances never join) and a digest of the profile and window size (instances
    whose layouts differ never map the same bytes). flock orders the writers. A count of the instances
    using it lets the last one to finalize remove the file; a server that is killed leaves it behind
    (a few hundred KB, gone at reboot; a restart of that server, with a new start time, uses a new file).
    """

    def __init__(self, folder, model_name, version, profile, window, nbytes):
        digest = hashlib.sha1(json.dumps([profile, window], sort_keys=True).encode()).hexdigest()[:16]
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"triton_builder_drift_{_server_key()}_{model_name}_{version}")
        self.path = os.path.join(folder, f"{name}_{digest}")
        size = 8 + nbytes  # the count of instances using it, then the window's state
        for _ in range(3):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                stat = os.fstat(fd)
                if stat.st_nlink and stat.st_size not in (0, size):
                    raise OSError(f"{self.path} holds {stat.st_size} bytes, not {size}")
            except BaseException:
                os.close(fd)
                raise
            if stat.st_nlink:
                break
            os.close(fd)  # its last user removed it as we opened it: open the name again
        else:
            raise OSError(f"{self.path} was removed 3 times as it was opened")
        try:
            os.ftruncate(fd, size)  # a new file reads as zeros: an empty window
            self.map = mmap.mmap(fd, size)
            self.users = np.frombuffer(self.map, np.int64, 1, 0)
            self.users[0] += 1
            self.buffer = memoryview(self.map)[8:]
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        fcntl.flock(fd, fcntl.LOCK_UN)

    @classmethod
    def folder(cls):
        """tmpfs where there is one (no disk writes for a window that changes with every request)."""
        return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self):
        if self.fd is None:
            return
        with self:
            self.users[0] -= 1
            if self.users[0] <= 0:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:  # someone cleaned /dev/shm: nothing left to remove
                    pass
        os.close(self.fd)
        self.fd = None


class _DriftHook:
    """Feeds a sample of the traffic to drift.DriftWindow and publishes its scores as gauges."""

    @classmethod
    def create(cls, folder, model_name, version, params, batching=False, instances=1):
        profile_path = os.path.join(folder, "drift_profile.json")
        code_path = os.path.join(folder, "drift.py")
        if params.get("drift", "on") == "off" or not (os.path.exists(profile_path) and os.path.exists(code_path)):
            return None
        spec = importlib.util.spec_from_file_location(f"triton_builder_drift_{model_name}_{version}", code_path)
        drift = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(drift)
        return cls(drift, drift.load_profile(profile_path), model_name, version, params, batching, instances)

    def __init__(self, drift, profile, model_name, version, params, batching=False, instances=1, shared_folder=None):
        self.sample_every = max(1, int(params.get("drift_sample_every", "1")))
        window = int(params.get("drift_window", "512"))
        self.shared = None
        try:
            self.shared = _SharedWindow(shared_folder or _SharedWindow.folder(), model_name, version, profile,
                                        window, drift.state_bytes(profile, window))
            self.window = drift.DriftWindow(profile, window=window, sample_every=1, buffer=self.shared.buffer,
                                            lock=self.shared)
        except (OSError, ValueError, AttributeError, IndexError) as exc:  # AttributeError: an older drift.py
            if self.shared is not None:
                self.shared.close()
                self.shared = None
            # each instance sees ~1/instances of the traffic: its share of the last `window` rows, so the
            # gauge (whichever instance set it last) still spans about the last `window` rows in time
            own = max(1, math.ceil(window / max(1, instances)))
            self.window = drift.DriftWindow(profile, window=own, sample_every=1)
            _log_warning(f"{model_name}/{version}: drift window not shared by the model's {instances} instance(s) "
                         f"({exc}); each keeps its own last {own} rows, so the drift gauges show one instance's")
        self.calls = 0
        self.clock = time.monotonic
        # rows on the first axis (batched models): sampled calls are gathered and binned together, in order,
        # so the window holds the same rows as binning each call would; unbatched models bin each call
        self.observe_rows = max(1, int(params.get("drift_observe_rows", "64"))) if batching else 1
        self.pending, self.pending_key, self.pending_rows, self.pending_bytes = [], None, 0, 0
        self.pending_since = 0.0
        self.labels = {"model": model_name, "version": str(version)}
        # publishing the gauges costs ~0.6 ms, far more than observing: do it every N sampled calls
        self.publish_every = int(params.get("drift_publish_every", "64"))
        self.sampled_since_publish = 0
        gauge = pb_utils.MetricFamily.GAUGE
        self.psi = pb_utils.MetricFamily(name="triton_builder_drift_psi", description="PSI of served traffic vs the build-time profile", kind=gauge)
        self.js = pb_utils.MetricFamily(name="triton_builder_drift_js", description="Jensen-Shannon distance (base 2) of served traffic vs the profile", kind=gauge)
        self.samples = pb_utils.MetricFamily(name="triton_builder_drift_window_samples", description="sampled rows in the drift window (all instances)", kind=gauge)
        thresholds = pb_utils.MetricFamily(name="triton_builder_drift_threshold", description="drift alert threshold", kind=gauge)
        for metric, default in (profile.get("thresholds") or {"psi": 0.25, "js": 0.2}).items():
            value = float(params.get(f"drift_{metric}_threshold", default))
            thresholds.Metric(labels={**self.labels, "metric": metric}).set(value)
        self._thresholds = thresholds
        self.samples_metric = self.samples.Metric(labels=self.labels)
        self.per_feature = {}

    def observe(self, feeds, outputs):
        call, self.calls = self.calls, self.calls + 1
        if call % self.sample_every:
            return
        self.sampled_since_publish += 1
        if self.observe_rows <= 1:
            self.window.observe(feeds, outputs)
        else:
            self._gather(feeds, outputs)
        if self.sampled_since_publish >= self.publish_every:
            self.sampled_since_publish = 0
            self.flush()
            self.publish()

    def _gather(self, feeds, outputs):
        key = tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted({**feeds, **outputs}.items()))
        now = self.clock()
        if self.pending and (key != self.pending_key or now - self.pending_since >= PENDING_MAX_AGE_S):
            self.flush()  # rows of another shape, or rows kept too long: bin what was gathered first
        rows = len(next(iter(feeds.values())))
        size = sum(a.nbytes for a in feeds.values()) + sum(a.nbytes for a in outputs.values())
        if not self.pending and (rows >= self.observe_rows or size >= PENDING_BYTES):
            self.window.observe(feeds, outputs)  # enough on its own: no copy
            return
        if not self.pending:
            self.pending_since = now
        # inputs may be views of Triton's request buffers, released once execute() returns: keep copies
        self.pending.append(({n: a if a.flags.owndata else a.copy() for n, a in feeds.items()},
                             {n: a if a.flags.owndata else a.copy() for n, a in outputs.items()}))
        self.pending_key = key
        self.pending_rows += rows
        self.pending_bytes += size
        if self.pending_rows >= self.observe_rows or self.pending_bytes >= PENDING_BYTES:
            self.flush()

    def flush(self):
        """Bin the gathered rows (one observe() over all of them)."""
        if not self.pending:
            return
        pending, self.pending, self.pending_rows, self.pending_bytes = self.pending, [], 0, 0
        if len(pending) == 1:
            self.window.observe(*pending[0])
            return
        feeds = {n: np.concatenate([p[0][n] for p in pending]) for n in pending[0][0]}
        outputs = {n: np.concatenate([p[1][n] for p in pending]) for n in pending[0][1]}
        self.window.observe(feeds, outputs)

    def publish(self):
        for feature, scores in self.window.scores().items():
            if feature not in self.per_feature:
                labels = {**self.labels, "feature": feature}
                self.per_feature[feature] = (self.psi.Metric(labels=labels), self.js.Metric(labels=labels))
            psi_metric, js_metric = self.per_feature[feature]
            psi_metric.set(float(scores["psi"]))
            js_metric.set(float(scores["js"]))
        self.samples_metric.set(float(self.window.samples))

    def close(self):
        if self.shared is not None:
            self.shared.close()
