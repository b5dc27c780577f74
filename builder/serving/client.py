"""The one Triton client of the package: HTTP or gRPC behind the same methods, plain Python answers.

Every module that talks to a running Triton (the served check, tuning, sweeps, load tests'
statistics, the embedded server's model control, replicas) goes through ``TritonClient``; nothing
else imports ``tritonclient.http``/``tritonclient.grpc`` (``tritonclient.grpc.model_config_pb2``,
used to parse config text with Triton's schema, is not a client).

- The protocol comes from the URL (``grpc://host:port``, ``http://host:port``) or from
  ``protocol=`` for a bare ``host:port`` (the form the CLI's ``--url`` takes); default HTTP.
- Answers are the same over both protocols: dicts, lists and numpy arrays, shaped as HTTP gives
  them (gRPC's protobuf answers are turned into the same dicts: defaults filled in, int64s as ints).
- Failures raise ``TritonError``, a ``builder.core.errors.ServerError`` naming the address and what was
  asked, with ``.reason`` (Triton's own words) and ``.unreachable`` (no answer at all).
- Model control (load, unload, the repository index) sends the server's control key
  (builder/serving/control_key.py): ``control_key=``, else the key of a server this process started at
  that address, else ``$TRITON_BUILDER_CONTROL_KEY``; a refusal names the variable.
- A server that stops answering: ``Liveness`` (its liveness endpoint, short timeouts; ``ServerGone``),
  ``WatchedClient`` (calls that may block for minutes, given up once it is gone); the requests a hung
  server takes when it wakes up are left to builder/serving/control_helper.py.

Usage::

    with TritonClient("grpc://127.0.0.1:8001") as triton:        # or ("127.0.0.1:8001", "grpc")
        triton.require_live()                                     # "cannot reach Triton at ..."
        out = triton.infer("digits_cnn", {"image": batch})       # {"logits": ndarray}
        triton.model_config("digits_cnn")["max_batch_size"]
        triton.statistics("digits_cnn")["model_stats"][0]["batch_stats"]
        triton.load_model("digits_cnn", config_json=json.dumps(cfg))
        triton.wait_for_model("digits_cnn")

The hot path of a load generator prepares a request once and sends it many times::

    request = prepare_request("grpc", sample, ["logits"])
    triton.send("digits_cnn", request)                            # no conversion of the answer
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from builder.core.errors import ServerError, UserInputError
from builder.serving import control_key as _control_key

PROTOCOLS = ("http", "grpc")
_LABELS = {"http": "HTTP", "grpc": "gRPC"}
#: gRPC status codes that mean "no answer" rather than "the server said no"
_UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "Connection refused", "Failed to connect")
_TEXT_FIELDS = ("name", "version", "versions", "state", "reason", "platform", "backend", "string_value", "key")


class TritonError(ServerError):
    """A request to Triton failed; ``reason`` is Triton's own message, ``unreachable`` if nothing answered."""

    def __init__(self, message: str, *, address: str = "", what: str = "", reason: str = "",
                 unreachable: bool = False, state: str | None = None):
        super().__init__(message)
        self.address, self.what, self.reason, self.unreachable, self.state = address, what, reason, unreachable, state


def split_url(url: str, protocol: str | None = None) -> tuple[str, str]:
    """``(address, protocol)`` from ``grpc://h:p``, ``http://h:p`` or ``h:p`` (+ ``protocol``, default http)."""
    scheme, sep, rest = url.partition("://")
    if sep:
        scheme = scheme.lower()
        if scheme in ("https", "grpcs"):
            raise UserInputError(f"--url {url!r}: TLS is not supported; use http:// or grpc://")
        if scheme not in PROTOCOLS:
            raise UserInputError(f"--url {url!r}: use http://HOST:PORT, grpc://HOST:PORT or HOST:PORT")
        if protocol is not None and protocol != scheme:
            raise UserInputError(f"--url {url!r} is {scheme} but --protocol is {protocol}")
        return rest.rstrip("/"), scheme
    protocol = protocol or "http"
    if protocol not in PROTOCOLS:
        raise UserInputError(f"--protocol {protocol!r}: use http or grpc")
    return url, protocol


def _module(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


def prepare_request(protocol: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None):
    """Inputs (and requested outputs) built once, for ``TritonClient.send`` on any client of ``protocol``."""
    from tritonclient.utils import np_to_triton_dtype

    module = _module(protocol)
    items = []
    for name, value in inputs.items():
        item = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        item.set_data_from_numpy(np.ascontiguousarray(value))
        items.append(item)
    return items, ([module.InferRequestedOutput(o) for o in outputs] if outputs else None)


def _plain(value: Any, key: str = "") -> Any:
    """gRPC JSON spells int64 as strings: ints again (names, versions and states stay text)."""
    if isinstance(value, dict):
        return {k: _plain(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, key) for v in value]
    if isinstance(value, str) and key not in _TEXT_FIELDS and not key.endswith(("filename", "filenames")) \
            and value.lstrip("-").isdigit():
        return int(value)
    return value


def _message(message) -> dict[str, Any]:
    """A gRPC answer as a plain dict: every field (defaults too), snake_case names, int64s as ints."""
    from google.protobuf import json_format

    try:
        answer = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf < 5
        answer = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                           including_default_value_fields=True)
    return _plain(answer)


def _schema_message(name: str):
    """An empty protobuf message of Triton's gRPC schema (``ModelStatisticsResponse``, ...)."""
    from tritonclient.grpc import service_pb2

    return getattr(service_pb2, name)()


def _through_schema(answer: dict[str, Any], message_name: str) -> dict[str, Any]:
    """An HTTP JSON answer in the shape its gRPC twin has: read into Triton's own protobuf message and
    printed with every field. Triton's HTTP JSON has no fixed set of keys (an empty ``response_stats`` map
    came back on one host and not on another), while gRPC prints every field of the schema. Keys this
    client's schema does not know (a newer server's) are dropped, as gRPC's answer drops them."""
    from google.protobuf import json_format

    return _message(json_format.ParseDict(answer, _schema_message(message_name), ignore_unknown_fields=True))


def normalised_statistics(answer: dict[str, Any]) -> dict[str, Any]:
    """Triton's HTTP statistics JSON with every field of the schema present, as gRPC's answer is."""
    return _through_schema(answer, "ModelStatisticsResponse")


class TritonClient:
    """One connection to one Triton server over HTTP or gRPC; see the module doc.

    ``server`` is how messages name it ("Triton", or "tritonserver" for the embedded one);
    ``on_error`` runs before a ``TritonError`` is raised (the embedded server checks that its
    process is still alive, and raises ``ServerDiedError`` instead). ``control_key``: the key sent with
    model control (see the module doc; never printed). Not thread-safe: one per thread.
    """

    def __init__(self, url: str, protocol: str | None = None, *, network_timeout: float = 60.0,
                 connection_timeout: float | None = None, server: str = "Triton",
                 on_error: Callable[[], object] | None = None, control_key: str | None = None):
        self.address, self.protocol = split_url(url, protocol)
        key = control_key or _control_key.key_for(self.address)
        self._control = {"headers": _control_key.headers(self.protocol, key)}
        self.network_timeout, self.server, self.on_error = network_timeout, server, on_error
        module = _module(self.protocol)
        try:
            if self.protocol == "http":
                self.raw = module.InferenceServerClient(
                    self.address, connection_timeout=connection_timeout or network_timeout,
                    network_timeout=network_timeout)
                self._kw: dict[str, Any] = {}
            else:
                self.raw = module.InferenceServerClient(self.address)
                self._kw = {"client_timeout": network_timeout}
        except Exception as exc:  # noqa: BLE001 - a malformed address
            raise UserInputError(f"--url {url!r}: {exc}; use HOST:PORT, e.g. 127.0.0.1:8001") from None

    @property
    def label(self) -> str:
        """``HTTP`` or ``gRPC``."""
        return _LABELS[self.protocol]

    def __repr__(self) -> str:
        return f"TritonClient({self.protocol}://{self.address})"

    def __enter__(self) -> "TritonClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.raw.close()
        except Exception:  # noqa: BLE001
            pass

    # -- errors ------------------------------------------------------------------------------

    def _error(self, what: str, exc: Exception) -> TritonError:
        from tritonclient.utils import InferenceServerException

        detail = " ".join(str(exc).split())
        if isinstance(exc, InferenceServerException):
            reason = (exc.message() or "").strip()
            # the status when there is one: a message may quote a model's "UNAVAILABLE state" (a refused load)
            status = str(exc.status() or "")
            unreachable = status.endswith(_UNREACHABLE[:2]) if status else any(mark in detail for mark in _UNREACHABLE)
        else:  # socket errors, timeouts, greenlet errors: nothing answered
            reason, unreachable = detail, True
        refused = _control_key.is_refusal(reason or detail)
        if refused:  # gRPC says UNAVAILABLE, but the server answered: it wants the control key
            unreachable = False
            reason = f"{reason or detail}; {_control_key.refusal_hint(self._control['headers'] is not None)}"
        if self.on_error is not None:
            self.on_error()
        if unreachable:
            message = f"{self.server} at {self.address} did not answer ({what}): {detail}"
        else:
            message = f"{self.server} at {self.address}: {what} failed: {reason or detail}"
        return TritonError(message, address=self.address, what=what, reason=reason or detail,
                           unreachable=unreachable)

    def _call(self, what: str, fn: Callable, *args, **kwargs):
        try:
            return fn(*args, **kwargs, **self._kw)
        except Exception as exc:  # noqa: BLE001 - tritonclient raises several kinds
            raise self._error(what, exc) from None

    # -- health ------------------------------------------------------------------------------

    def server_live(self) -> bool:
        return bool(self._call("liveness", self.raw.is_server_live))

    def server_ready(self) -> bool:
        return bool(self._call("readiness", self.raw.is_server_ready))

    def require_live(self, hint: str = "is it running?") -> None:
        """``TritonError`` "cannot reach Triton at ADDRESS over PROTOCOL (...); HINT" unless it answers."""
        try:
            if self.server_live():
                return
            detail = "not live"
        except TritonError as err:
            detail = err.reason
        raise TritonError(f"cannot reach Triton at {self.address} over {self.label} ({detail[:200]}); {hint}",
                          address=self.address, what="liveness", reason=detail, unreachable=True)

    def model_ready(self, name: str, version: str | int = "") -> bool:
        return bool(self._call(f"readiness of model '{name}'", self.raw.is_model_ready, name, str(version or "")))

    # -- models ------------------------------------------------------------------------------

    def model_config(self, name: str, version: str | int = "") -> dict[str, Any]:
        """The config Triton loaded, as HTTP gives it: every field (defaults too), numbers as ints."""
        answer = self._call(f"config of model '{name}'", self.raw.get_model_config, name, str(version or ""))
        return answer if self.protocol == "http" else _message(answer.config)

    def model_metadata(self, name: str, version: str | int = "") -> dict[str, Any]:
        """``{"name", "versions", "platform", "inputs": [{"name", "datatype", "shape": [int]}], "outputs"}``."""
        answer = self._call(f"metadata of model '{name}'", self.raw.get_model_metadata, name, str(version or ""))
        return answer if self.protocol == "http" else _message(answer)

    def statistics(self, name: str = "", version: str | int = "") -> dict[str, Any]:
        """``{"model_stats": [...]}`` with every counter an int (``batch_stats`` included); all models without ``name``."""
        answer = self._call(f"statistics of '{name}'" if name else "statistics", self.raw.get_inference_statistics,
                            name, str(version or ""))
        return normalised_statistics(answer) if self.protocol == "http" else _message(answer)

    def repository_index(self) -> list[dict[str, Any]]:
        """One ``{"name", "version", "state", "reason"}`` dict per model (and version) in the repository."""
        answer = self._call("repository index", self.raw.get_model_repository_index, **self._control)
        if self.protocol == "http":
            entries = answer
        else:  # a model never loaded: HTTP leaves out version and state, gRPC fills in "" (protobuf defaults)
            entries = [{k: v for k, v in entry.items() if not (k in ("version", "state") and v == "")}
                       for entry in _message(answer).get("models", [])]
        return [{**entry, "reason": entry.get("reason", "")} for entry in entries]  # HTTP leaves out an empty one

    def model_state(self, name: str) -> tuple[str | None, str]:
        """``(state, reason)`` of a model: READY if any version is, else its first entry; state None if absent."""
        entries = [e for e in self.repository_index() if e.get("name") == name]
        for entry in entries:
            if entry.get("state") == "READY":
                return "READY", entry.get("reason", "")
        # no state (never loaded, either protocol) is None: "load it", not "it failed, fix it"
        return (entries[0].get("state") or None, entries[0].get("reason", "")) if entries else (None, "")

    def load_model(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) ``name``, with ``config_json`` replacing its config; blocks until Triton is done.
        ``files`` (``{"file:1/model.onnx": bytes}``, with ``config_json``): the model's folder is these files,
        not the repository's - a model of that name need not be in the repository."""
        extra = {"files": files} if files is not None else {}
        self._call(f"load of model '{name}'", self.raw.load_model, name, config=config_json, **extra, **self._control)

    def unload_model(self, name: str, *, wait: bool = False, timeout: float = 60.0,
                     unload_dependents: bool = False) -> None:
        """Unload ``name``; with ``wait``, return once no version of it is READY or UNLOADING."""
        self._call(f"unload of model '{name}'", self.raw.unload_model, name, unload_dependents=unload_dependents,
                   **self._control)
        if wait:
            deadline = time.monotonic() + timeout
            while self.model_state(name)[0] in ("READY", "UNLOADING"):
                if time.monotonic() > deadline:
                    raise TritonError(f"model '{name}' was still loaded {timeout:g} s after the unload request",
                                      address=self.address, what=f"unload of model '{name}'", state="READY")
                time.sleep(0.05)

    def wait_for_model(self, name: str, timeout: float = 60.0, poll: float = 0.1) -> None:
        """Wait until ``name`` is READY; ``TritonError`` (``.state``, ``.reason``) if it became UNAVAILABLE."""
        deadline = time.monotonic() + timeout
        while True:
            state, reason = self.model_state(name)
            if state == "READY":
                return
            if state == "UNAVAILABLE" and reason and reason != "unloaded":
                raise TritonError(f"model '{name}' is UNAVAILABLE: {reason}", address=self.address,
                                  what=f"load of model '{name}'", reason=reason, state=state)
            if time.monotonic() > deadline:
                raise TritonError(f"model '{name}' was not ready within {timeout:g} s "
                                  f"(state: {state or 'not loaded'})", address=self.address,
                                  what=f"load of model '{name}'", reason=reason, state=state)
            time.sleep(poll)

    # -- inference ---------------------------------------------------------------------------

    def prepare(self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None):
        """``prepare_request`` for this client's protocol."""
        return prepare_request(self.protocol, inputs, outputs)

    def send(self, model: str, request, version: str = ""):
        """The hot path: one prepared request, tritonclient's result object back (no conversion)."""
        inputs, outputs = request
        try:
            return self.raw.infer(model, inputs, model_version=version, outputs=outputs, **self._kw)
        except Exception as exc:  # noqa: BLE001
            raise self._error(f"inference of '{model}'", exc) from None

    def infer(self, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
              version: str | int | None = None) -> dict[str, np.ndarray]:
        """One request with numpy inputs; ``{output name: ndarray}`` (every output without ``outputs``)."""
        result = self.send(model, self.prepare(inputs, outputs), "" if version is None else str(version))
        if outputs is None:
            response = result.get_response()
            outputs = [o["name"] for o in response["outputs"]] if isinstance(response, dict) else \
                [o.name for o in response.outputs]
        return {name: result.as_numpy(name) for name in outputs}


# -- a server that stops answering -------------------------------------------------------------

#: one liveness request: a live Triton answers it at once, even while it loads a model on a busy host
LIVENESS_TIMEOUT_S = 5.0
#: every liveness request unanswered for this long: the server is taken as gone (a hung or stopped process)
SILENT_LIMIT_S = 15.0
#: how often a watched call in flight is checked on
WATCH_PERIOD_S = 2.0


class ServerGone(TritonError):
    """The server stopped answering (``Liveness``): the caller stops, rather than fail call after call."""


class Liveness:
    """Whether a server still answers, judged by its liveness endpoint with a short timeout: ``gone()``
    once every try over ``SILENT_LIMIT_S`` went unanswered. ``watch(fn)`` runs a call that may block for
    minutes (a model load: its own timeout must allow a slow load) on a helper thread, and raises
    ``ServerGone`` as soon as the server is gone rather than when that timeout ends.

    Usage::

        liveness = Liveness("127.0.0.1:8001", "grpc")
        liveness.watch(client.load_model, "m")   # ServerGone: "server at 127.0.0.1:8001 unreachable since ..."
        liveness.require()                        # after a failure: returns once it answers, else ServerGone
    """

    def __init__(self, url: str, protocol: str | None = None, *, timeout: float | None = None,
                 silent_limit: float | None = None, period: float | None = None):
        self.url, self.protocol = url, protocol
        self.timeout = timeout or LIVENESS_TIMEOUT_S
        self.silent_limit = silent_limit or SILENT_LIMIT_S
        self.period = period or WATCH_PERIOD_S
        self.last_answer = time.time()
        self.silent_since: float | None = None  # the first unanswered try since the last answer
        self.reason = ""
        self._client: TritonClient | None = None

    def answered(self) -> None:
        """The server answered something just now (a request, a load)."""
        self.last_answer, self.silent_since = time.time(), None

    def poll(self) -> bool:
        """One liveness request; whether it was answered."""
        started = time.time()
        if self._client is None:
            self._client = TritonClient(self.url, self.protocol, network_timeout=self.timeout,
                                        connection_timeout=self.timeout)
        try:
            live = self._client.server_live()
            self.reason = "" if live else "its liveness endpoint says not live"
        except TritonError as err:
            live, self.reason = False, " ".join(err.reason.split())[:200]
        if live:
            self.answered()
        elif self.silent_since is None:
            self.silent_since = started
        return live

    def gone(self) -> bool:
        return self.silent_since is not None and time.time() - self.silent_since >= self.silent_limit

    def require(self) -> None:
        """Return once the server answers; ``ServerGone`` once it has not for ``silent_limit`` seconds."""
        while not self.poll():
            if self.gone():
                raise self.error()
            time.sleep(min(self.period, 1.0))

    def error(self) -> ServerGone:
        since = time.strftime("%H:%M:%S", time.localtime(self.last_answer))
        return ServerGone(f"server at {self.url} unreachable since {since} ({time.time() - self.last_answer:.0f} s "
                          f"without an answer; last error: {self.reason or 'none'})", address=self.url,
                          what="liveness", reason=self.reason, unreachable=True)

    def watch(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` on a helper thread, checked on every ``period``: its result or exception,
        or ``ServerGone`` (the call is left to end on its own, with whatever client it uses: that client
        must not be used again)."""
        import threading

        outcome: list = []

        def call():
            try:
                outcome.append((True, fn(*args, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
                outcome.append((False, exc))

        worker = threading.Thread(target=call, name="watched Triton call", daemon=True)
        worker.start()
        while True:
            worker.join(self.period)
            if not worker.is_alive():
                break
            self.poll()
            if self.gone():
                raise self.error()
        ok, value = outcome[0]
        if not ok:
            raise value
        self.answered()
        return value

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class WatchedClient:
    """``TritonClient``'s methods, each call watched by ``liveness`` (``Liveness.watch``): for calls that may
    block for minutes (model control). Each call has a client of its own, made on the call's thread (an
    HTTP client works only on the thread that made it; an abandoned call keeps its own)."""

    def __init__(self, url: str, protocol: str | None = None, **options):
        self.url, self.protocol, self.options = url, protocol, options
        self.liveness = Liveness(url, protocol)

    def __getattr__(self, name: str):
        if name.startswith("_") or not callable(getattr(TritonClient, name, None)):
            raise AttributeError(name)

        def call(*args, **kwargs):
            with TritonClient(self.url, self.protocol, **self.options) as client:
                return getattr(client, name)(*args, **kwargs)

        return lambda *args, **kwargs: self.liveness.watch(call, *args, **kwargs)

    def close(self) -> None:
        self.liveness.close()
