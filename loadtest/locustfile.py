"""Locust users for any model on a Triton server, over HTTP or gRPC (tritonclient).

    locust --config loadtest/locust.conf -f loadtest/locustfile.py,loadtest/shapes.py,loadtest/triton_target.py \
           --host 127.0.0.1:8000 --triton-model digits_cnn [--triton-protocol grpc --host 127.0.0.1:8001]

Nothing here is model specific (what is sent: triton_target.py, beside this file): the inputs' names,
datatypes and shapes come from the server (``/v2/models/NAME`` and ``/config``), and the values from
``--payload`` (a version's reference.npz, or an .npz keyed by input name with rows along the first
axis), else are generated (floats uniform in [0, 1), integers zero, dynamic dims 16). Each user sends one request at a time, with no pause
(a closed loop): ``--users`` is the number of requests in flight.

SLOs: when the test ends, p99 and the failure ratio over the whole run are checked against
``--slo-p99-ms`` and ``--slo-max-failure-ratio``; the exit code is 1 and the reason printed if
either is broken, 0 otherwise. Bad settings or an unreachable model exit with 2 before any load.
A server that dies during the run: users back off on connection errors, and once no request has
reached it for ``--triton-unreachable-s`` seconds the run stops and exits 2 with "server at URL
unreachable since ...". The console summary names the top failure reasons with their counts.

Distributed: workers get these settings from the master, and read ``--payload`` from their own disk;
a worker that has no file at that path asks the master for its bytes. See loadtest/README.md.
"""

# gRPC must cooperate with gevent (which Locust runs on) before any channel exists; without this,
# gRPC calls block the whole process and users take turns instead of running concurrently.
import grpc.experimental.gevent as _grpc_gevent

_grpc_gevent.init_gevent()

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
import gevent.lock  # noqa: E402
import numpy as np  # noqa: E402
from locust import User, constant, events, task  # noqa: E402
from locust.runners import MasterRunner, WorkerRunner  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes import SHAPES, TritonLoadShape  # noqa: E402,F401  (Locust picks the shape class up from here)
from triton_target import Target, _address, _client  # noqa: E402

log = logging.getLogger("triton-locust")


@events.init_command_line_parser.add_listener
def _arguments(parser):
    group = parser.add_argument_group("Triton")
    group.add_argument("--triton-model", default="", env_var="TRITON_MODEL", help="model name (required)")
    group.add_argument("--triton-model-version", default="", help="model version (default: the server's choice)")
    group.add_argument("--triton-protocol", choices=("http", "grpc"), default="http",
                       help="tritonclient protocol; --host must be the server's port for it")
    group.add_argument("--triton-batch-size", type=int, default=1, help="rows per request (default 1)")
    group.add_argument("--triton-timeout-s", type=float, default=10.0, help="per-request timeout (s)")
    group.add_argument("--payload", default="", help="request data: reference.npz or .npz keyed by input name")
    group.add_argument("--slo-p99-ms", type=float, default=0.0, help="p99 SLO in ms over the run (0: none)")
    group.add_argument("--slo-max-failure-ratio", type=float, default=0.01, help="largest allowed failure ratio")
    group.add_argument("--load-shape", choices=SHAPES, default="constant", help="constant | ramp | steps")
    group.add_argument("--load-steps", type=int, default=4, help="number of steps of --load-shape steps")
    group.add_argument("--result-json", default="", help="write the run's final numbers and SLO verdict here")
    group.add_argument("--triton-unreachable-s", type=float, default=3.0,
                       help="stop the run (exit 2) when the server refuses connections for this long")


_target = None
_target_lock = gevent.lock.Semaphore()
_payload_reply = gevent.event.AsyncResult()


def _get_target(environment):
    """The process's Target; a worker without the payload file asks the master for it."""
    global _target
    with _target_lock:
        if _target is None:
            options = environment.parsed_options
            payload_bytes = None
            if isinstance(environment.runner, WorkerRunner) and options.payload and not os.path.isfile(options.payload):
                environment.runner.send_message("triton_payload_request", options.payload)
                answer = _payload_reply.get(timeout=60)
                if "error" in answer:
                    raise ValueError(answer["error"])
                payload_bytes = answer["data"]
            _target = Target(options, environment.host, payload_bytes)
        return _target


@events.init.add_listener
def _on_init(environment, runner, **_kwargs):
    if isinstance(runner, WorkerRunner):
        runner.register_message("triton_payload", lambda environment, msg, **kw: _payload_reply.set(msg.data))
        return
    if isinstance(runner, MasterRunner):
        def worker_gave_up(environment, msg, **kw):
            if not _reachability.given_up:
                _reachability.given_up = msg.data
                stop_the_run(environment, msg.data)

        runner.register_message("triton_unreachable", worker_gave_up)

        def send_payload(environment, msg, **kw):
            path = environment.parsed_options.payload
            try:
                with open(path, "rb") as handle:
                    data = {"data": handle.read()}
            except OSError as exc:
                data = {"error": f"the master cannot read --payload {path}: {exc}"}
            environment.runner.send_message("triton_payload", data, client_id=msg.node_id)

        runner.register_message("triton_payload_request", send_payload)
    # local or master: check the settings and the server now, before any load (exit 2 on error)
    options = environment.parsed_options
    if options.load_shape != "constant" and not options.run_time:
        _fail(f"--load-shape {options.load_shape} needs --run-time")
    if options.slo_max_failure_ratio < 0 or options.slo_p99_ms < 0:
        _fail("--slo-p99-ms and --slo-max-failure-ratio must be >= 0")
    try:
        target = _get_target(environment)
    except Exception as exc:  # noqa: BLE001 - every failure here is a settings or server problem
        _fail(" ".join(str(exc).split()))
    print(f"triton-locust: {target.model} over {target.protocol} at {target.host}, "
          f"{len(target.samples)} request payload(s) from {target.source}", file=sys.stderr, flush=True)


def _fail(message):
    print(f"triton-locust: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------
# A server that stops answering: back off per user, stop the run once it stays unreachable

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 0.5


class Reachability:
    """When a request last reached the server, and what the last failure without an answer said."""

    def __init__(self):
        self.last_success = time.time()  # the server answered the pre-run checks just now
        self.connection_errors = 0  # failures without an answer since the last success
        self.reason = ""
        self.given_up = ""  # the message once the run was stopped for it

    def failed(self, exc):
        self.connection_errors += 1
        self.reason = " ".join(f"{type(exc).__name__}: {_describe(exc)}".split())[:200]

    def reached(self):
        self.last_success, self.connection_errors = time.time(), 0

    def silent_for(self):
        return time.time() - self.last_success


_reachability = Reachability()


class RequestFailed(Exception):
    """What Locust's error report shows for a failed request: the client's exception type, status and
    message (tritonclient's exceptions print as an empty repr)."""


def _describe(exc):
    status = exc.status() if callable(getattr(exc, "status", None)) else None
    text = str(exc) or (exc.message() if callable(getattr(exc, "message", None)) else "") or ""
    return f"[{status}] {text}" if status else text


def is_connection_error(exc):
    """A failure without an answer from the server: refused/reset/closed connections and timeouts
    (HTTP), UNAVAILABLE / DEADLINE_EXCEEDED or no status at all (gRPC) - as opposed to a request the
    server answered with an error."""
    if isinstance(exc, (ConnectionError, OSError)):
        return True
    status = exc.status() if callable(getattr(exc, "status", None)) else None
    if status is None or str(status).strip() in ("", "None"):
        return True
    text = f"{status} {exc}".lower()
    return any(mark in text for mark in ("unavailable", "deadline", "connection", "failed to connect", "timed out"))


def _port_refuses(host):
    """True when nothing listens at host:port any more (a dead server), False when it accepts or is slow."""
    import socket

    address, _, port = host.rpartition(":")
    try:
        with socket.create_connection((address.strip("[]") or "127.0.0.1", int(port)), timeout=1.0):
            return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    except (OSError, ValueError):
        return False


def unreachable_message(host, reachability):
    since = time.strftime("%H:%M:%S", time.localtime(reachability.last_success))
    return (f"server at {host} unreachable since {since} ({reachability.silent_for():.1f} s without an answer; "
            f"last error: {reachability.reason or 'connection refused'})")


def _watch_reachability(environment):
    """Local or worker process: once no request has reached the server for --triton-unreachable-s
    seconds and either requests failed without an answer or its port refuses connections (a hung
    transport fails only at the request timeout), stop the run (a worker tells the master)."""
    limit = float(environment.parsed_options.triton_unreachable_s)
    host = _address(environment.host)
    while True:
        gevent.sleep(0.25)
        if _reachability.given_up or _reachability.silent_for() < limit:
            continue
        if not (_reachability.connection_errors or _port_refuses(host)):
            continue  # alive, just slow
        _reachability.given_up = unreachable_message(host, _reachability)
        if isinstance(environment.runner, WorkerRunner):
            environment.runner.send_message("triton_unreachable", _reachability.given_up)
        else:
            stop_the_run(environment, _reachability.given_up)
        return


def stop_the_run(environment, reason):
    """End the run early, the way it ends when --run-time has passed: the load shape's next tick
    returns None and Locust stops once. Calling runner.quit() here as well raced that path (two stops of
    the same users: "Tried to stop User in an unexpected state: stopping" in the log). Without a load
    shape there is no other stop path, so quit directly."""
    print(f"triton-locust: error: {reason}; stopping the run", file=sys.stderr, flush=True)
    environment.triton_stop_reason = reason
    if environment.shape_class is None:
        environment.runner.quit()


@events.test_start.add_listener
def _on_test_start(environment, **_kwargs):
    if not isinstance(environment.runner, MasterRunner):
        _reachability.reached()  # the clock starts with the load
        gevent.spawn(_watch_reachability, environment)


# ---------------------------------------------------------------------------------------------
# The user


class TritonUser(User):
    """One request in flight at a time, no pause between them (closed loop)."""

    wait_time = constant(0)

    def on_start(self):
        target = _get_target(self.environment)
        self.target = target
        self.requests = target.requests()
        self.index = int(np.random.default_rng().integers(len(self.requests)))
        _, self.client = _client(target.protocol, target.host, target.timeout)
        _open_clients.add(self.client)
        self.kind = "gRPC" if target.protocol == "grpc" else "HTTP"
        self.name = f"{target.model} infer"

    @task
    def infer(self):
        inputs, outputs = self.requests[self.index % len(self.requests)]
        self.index += 1
        extra = {"client_timeout": self.target.timeout} if self.target.protocol == "grpc" else {}
        start = time.perf_counter()
        exception, size = None, 0
        try:
            result = self.client.infer(self.target.model, inputs, model_version=self.target.version,
                                       outputs=outputs, **extra)
            size = sum(result.as_numpy(o).nbytes for o in self.target.outputs)
            _reachability.reached()
            self.backoff = 0.0
        except Exception as exc:  # noqa: BLE001 - every error is a failed request in the report
            exception = exc
        reported = RequestFailed(f"{type(exception).__name__}: {_describe(exception)}") if exception else None
        self.environment.events.request.fire(
            request_type=self.kind, name=self.name, response_time=(time.perf_counter() - start) * 1000.0,
            response_length=size, exception=reported, context={})
        if exception is not None and is_connection_error(exception):
            # no retry storm against a dead server: wait, doubling up to BACKOFF_MAX_S
            _reachability.failed(exception)
            self.backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, 2 * getattr(self, "backoff", 0.0)))
            gevent.sleep(self.backoff)

    def on_stop(self):
        # a gRPC channel left open keeps the process alive after "Shutting down", deaf to SIGTERM
        client = getattr(self, "client", None)
        if client is not None:
            _open_clients.discard(client)
            client.close()
            self.client = None


# a user killed mid-task (after --stop-timeout) never reaches on_stop: its client is closed at quit
_open_clients = set()


@events.quitting.add_listener
def _close_left_clients(environment, **_kwargs):
    while _open_clients:
        try:
            _open_clients.pop().close()
        except Exception:  # noqa: BLE001 - closing at exit must not hide the run's verdict
            pass


# ---------------------------------------------------------------------------------------------
# End of the run: the whole run's numbers, the SLO verdict, the exit code


def run_result(environment):
    """The run's client-side numbers (final: Locust's CSV is only rewritten every second)."""
    total = environment.stats.total
    result = {"requests": total.num_requests, "failures": total.num_failures,
              "failure_ratio": round(total.fail_ratio, 6), "rps": round(total.total_rps, 2),
              "avg_ms": round(total.avg_response_time, 3), "min_ms": total.min_response_time,
              "max_ms": total.max_response_time, "errors": {}}
    for q in (50, 90, 95, 99):
        result[f"p{q}_ms"] = total.get_response_time_percentile(q / 100) if total.num_requests else None
    for error in sorted(environment.stats.errors.values(), key=lambda e: -e.occurrences)[:10]:
        result["errors"][" ".join(str(error.error).split())[:300]] = error.occurrences
    return result


def _p99_upper_bound(p99_ms):
    """The highest latency Locust's reported percentile may stand for: it rounds response times to whole ms
    below 100 ms, to 10 ms below 1 s, to 100 ms above. A sub-millisecond run reads p99 0 ms; an SLO the tool
    cannot resolve is judged against what the p99 may be, never reported met on a rounded-down figure."""
    step = 1 if p99_ms < 100 else 10 if p99_ms < 1000 else 100
    return p99_ms + step / 2


@events.quitting.add_listener
def _finish(environment, **_kwargs):
    if isinstance(environment.runner, WorkerRunner):
        return  # the master judges the whole run
    options = environment.parsed_options
    result = run_result(environment)
    broken = []
    if result["requests"] == 0:
        broken.append("no request completed")
    else:
        highest = _p99_upper_bound(result["p99_ms"])
        if options.slo_p99_ms and highest > options.slo_p99_ms:
            resolution = "" if highest == result["p99_ms"] else f" (Locust's resolution: up to {highest:g} ms)"
            broken.append(f"p99 {result['p99_ms']:g} ms{resolution} > --slo-p99-ms {options.slo_p99_ms:g}")
        if result["failure_ratio"] > options.slo_max_failure_ratio:
            broken.append(f"failure ratio {result['failure_ratio']:.4f} ({result['failures']} of {result['requests']}) "
                          f"> --slo-max-failure-ratio {options.slo_max_failure_ratio:g}")
    if environment.runner is not None and environment.runner.exceptions:
        broken.append(f"{len(environment.runner.exceptions)} error(s) in the locustfile (see the exceptions report)")
    if _reachability.given_up:
        broken.insert(0, _reachability.given_up)
        result["unreachable"] = _reachability.given_up
    print(f"triton-locust: {result['requests']} requests, {result['failures']} failures, {result['rps']:.1f} req/s, "
          f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms", file=sys.stderr, flush=True)
    for text, count in list(result["errors"].items())[:3]:
        print(f"triton-locust: failure x{count}: {text}", file=sys.stderr, flush=True)
    for reason in broken:
        print(f"triton-locust: SLO broken: {reason}", file=sys.stderr, flush=True)
    if not broken:
        print("triton-locust: SLO met", file=sys.stderr, flush=True)
    result["slo"] = {"p99_ms": options.slo_p99_ms or None, "max_failure_ratio": options.slo_max_failure_ratio,
                     "met": not broken, "broken": broken}
    if options.result_json:
        import json

        with open(options.result_json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    environment.process_exit_code = 2 if _reachability.given_up else 1 if broken else 0
