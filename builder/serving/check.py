"""`triton-builder check`: the served accuracy gate.

Sends the version's reference.npz inputs (every case: several batch sizes and dynamic sizes) to a
RUNNING Triton over HTTP and/or gRPC and compares the answers with the stored reference outputs,
with the metrics and tolerance of the build's verification. It also reads back the config Triton
actually loaded and reports every difference from what the builder intended.

Usage::

    report = check_served("digits_cnn", repository="model_repository", url="127.0.0.1:8000",
                          grpc_url="127.0.0.1:8001", protocol="both")
    report.ok          # False -> report.lines() lists each output with its numbers

Exit codes in the CLI: 0 all within tolerance, 1 a difference, 2 server unreachable / model not ready.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.accuracy.tensors import compare_outputs, from_wire, merge_case_metrics, to_wire, tolerance_failures
from builder.core.errors import ServerError, UserInputError
from builder.core.host import host_warnings
from builder.repository.config import config_as_dict
from builder.repository.layout import is_pipeline, latest_version, model_dir, not_in_repository
from builder.repository.metadata import read_metadata, read_reference
from builder.repository.monitored import ENSEMBLE_VERSION
from builder.serving.check_pipeline import check_pipeline, read_pipeline_reference
from builder.serving.client import TritonClient, TritonError


@dataclass
class CheckReport:
    model: str
    version: int
    metrics: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # protocol -> output -> metric
    failures: list[str] = field(default_factory=list)
    config_differences: list[str] = field(default_factory=list)
    cases: int = 0
    # this machine differs from the build's, where the server runs here (not a failure; check_host_warnings)
    host_warnings: list[str] = field(default_factory=list)
    basis: str = ""  # what the stored outputs are: a variant verified by task accuracy stores its own

    @property
    def ok(self) -> bool:
        return not self.failures and not self.config_differences

    def lines(self) -> list[str]:
        status = "OK" if self.ok else "FAIL"
        out = [f"{self.model} version {self.version}: {status} ({self.cases} cases per protocol)"]
        for protocol, metrics in self.metrics.items():
            for name, m in metrics.items():
                if "rel_l2" in m:
                    out.append(f"  {protocol:4s} {name}: rel L2 {m['rel_l2']:.1e}, max abs {m['max_abs']:.1e}, "
                               f"cosine {m['cosine']:.6f}")
                elif name == "pipeline":
                    out.append(f"  {protocol:4s} raw inputs through the ensemble vs the pipeline's reference: "
                               + ", ".join(f"{k.replace('_', ' ')} {v:.6g}" for k, v in m.items()))
        out += [f"- {f}" for f in self.failures]
        out += [f"- config: {d}" for d in self.config_differences]
        out += [f"- host: {w}" for w in self.host_warnings]
        out += [f"- compared with: {self.basis}"] if self.basis else []
        return out


def _split_url(url: str) -> tuple[str, int]:
    host, _, port = url.rpartition(":")
    if not host or not port.isdigit():
        raise UserInputError(f"--url {url!r}: use HOST:PORT, e.g. 127.0.0.1:8000")
    return host, int(port)


def check_served(name: str, *, repository: str | Path = "model_repository", url: str = "127.0.0.1:8000",
                 grpc_url: str | None = None, protocol: str = "both", version: int | None = None,
                 timeout: float = 30.0, current_host: dict | None = None) -> CheckReport:
    """``current_host``: this host's profile (builder/core/host.py host_profile) unless injected."""
    folder = model_dir(Path(repository), name)
    if not folder.is_dir():
        raise not_in_repository(name, Path(repository))
    number = version if version is not None else latest_version(folder)
    if number is None or not (folder / str(number)).is_dir():
        raise UserInputError(f"model '{name}' has no version {version if version is not None else '(none at all)'}")
    meta_path = folder / str(number) / "metadata.yaml"
    meta = read_metadata(meta_path)
    cases, outputs = read_reference(folder / str(number) / "reference.npz")
    tolerance = (meta.get("verification") or {}).get("tolerance") or {"rel_l2": 1e-5}
    output_names = [o["name"] for o in meta["spec"]["outputs"]]
    if protocol not in ("http", "grpc", "both"):
        raise UserInputError(f"--protocol {protocol!r}: use http, grpc or both")
    if grpc_url is None:
        host, port = _split_url(url)
        grpc_url = f"{host}:{port + 1}"
    protocols = ["http", "grpc"] if protocol == "both" else [protocol]
    report = CheckReport(name, number, cases=len(cases), host_warnings=check_host_warnings(
        meta, name, [url if p == "http" else grpc_url for p in protocols], current_host, source=meta_path))
    if meta.get("verified_by") == "task_accuracy":
        report.basis = _task_accuracy_basis(meta)
    # deploy.monitor: clients call the ensemble, which serves the latest version; an older one is asked directly
    request_name, request_version = folder.name, number
    text_pipeline = is_pipeline(Path(repository), name)  # a Hugging Face source: its model step takes tensors
    pipeline = read_pipeline_reference(folder / str(number)) if text_pipeline else None
    if pipeline is not None and number != latest_version(folder):
        report.basis = ((report.basis + "; ") if report.basis else "") + (
            f"version {number} asked of {folder.name} directly: the ensemble '{name}' serves the latest version only")
        pipeline = None
    if folder.name != name and not text_pipeline:  # deploy.monitor: model_dir resolved the ensemble to its model step
        if number == latest_version(folder):
            request_name, request_version = name, ""
        else:
            report.basis = ((report.basis + "; ") if report.basis else "") + (
                f"version {number} asked of {folder.name} directly: the ensemble '{name}' (and its monitor step) "
                "serves the latest version only")

    # Only the protocols asked for are contacted: a gRPC-only endpoint (--protocol grpc) has no HTTP
    # port to ask for liveness or the loaded config, and the first protocol's answers serve for both.
    clients: dict[str, TritonClient] = {}
    try:
        for proto in protocols:
            clients[proto] = _connected_client(url if proto == "http" else grpc_url, proto, timeout)
        first = clients[protocols[0]]
        _require_ready(first, folder.name, number, first.address)
        if request_name != folder.name or pipeline is not None:
            _require_ready(first, name, ENSEMBLE_VERSION, first.address)
        intended = config_as_dict((folder / "config.pbtxt").read_text())
        report.config_differences = config_differences(intended, first.model_config(folder.name))
        batching = int(intended.get("max_batch_size", 0)) > 0
        wire_dims = {t["name"]: [int(d) for d in t.get("dims", [])] for t in intended.get("input", [])}

        for proto in protocols:
            try:
                per_case = []
                for case, ref in zip(cases, outputs):
                    sent = {k: to_wire(v, wire_dims.get(k, []), batching) for k, v in case["inputs"].items()}
                    got = clients[proto].infer(request_name, sent, output_names, version=request_version)
                    per_case.append(compare_outputs(ref, {k: from_wire(v, ref[k]) if k in ref else v
                                                          for k, v in got.items()}))
            except TritonError as exc:  # a failed request is a failed gate, with the server's words
                report.failures.append(f"{proto}: request failed: {' '.join(exc.reason.split())[:300]}")
                continue
            metrics = merge_case_metrics(per_case)
            report.metrics[proto] = metrics
            report.failures += [f"{proto} {line}" for line in tolerance_failures(metrics, tolerance)]
            if pipeline is not None:  # the model step took tensors above; the ensemble takes the raw texts
                failures, figures = check_pipeline(clients[proto], name, pipeline, int(intended.get("max_batch_size", 0)),
                                                   (meta.get("artifact") or {}).get("precision", "fp32"), tolerance)
                report.metrics[proto]["pipeline"] = figures
                report.failures += [f"{proto} {line}" for line in failures]
    finally:
        for client in clients.values():
            client.close()
    return report


def on_this_machine(address: str) -> bool:
    """Whether HOST:PORT (or a URL) names this machine by a loopback or unspecified address or localhost."""
    host = address.split("://")[-1].rpartition(":")[0].strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def check_host_warnings(meta: dict[str, Any], name: str, addresses: list[str], current_host: dict | None = None,
                        *, source: Path | str | None = None) -> list[str]:
    """The host warnings check can honestly give. It cannot see the server's process, and usable cores
    are per process (a server under taskset -c 0 serving a 1-core build is right, whatever cores check
    may use), so never those; the CPU model, ISA class and GPUs are per machine, so those only where
    every server address is this machine. A remote server's host is not known here: nothing is said."""
    if not addresses or not all(on_this_machine(a) for a in addresses):
        return []
    return host_warnings(meta, name, current_host, source=source, per_process=False)


def _task_accuracy_basis(meta: dict[str, Any]) -> str:
    """A variant that changes the function by design (stage compress) stores its OWN verified outputs in
    reference.npz; say so, with the task accuracy it was verified by at build time."""
    acc = meta.get("accuracy") or {}
    where = ""
    if acc.get("variant") is not None and acc.get("reference") is not None:
        where = (f": top-1 {acc['variant']:.2f}% vs the model's {acc['reference']:.2f}% on the labelled validation "
                 f"data (drop {acc.get('drop', 0):+.2f} points)")
    return (f"the {meta['artifact']['variant']} variant's own outputs (verified by task accuracy at build time{where}), "
            "not the original model's")


def _connected_client(url: str, protocol: str, timeout: float) -> TritonClient:
    """A client that has answered a liveness request; the hint names the flag that sets its address."""
    client = TritonClient(url, protocol, network_timeout=timeout)
    try:
        client.require_live("is it running? (triton-builder serve prints its address)"
                            if protocol == "http" else "is it running? pass its gRPC address with --grpc-url")
    except ServerError:
        client.close()
        raise
    return client


def _require_ready(client: TritonClient, name: str, version: int, url: str) -> None:
    if client.model_ready(name, version):
        return
    reason, ready = "", []
    try:
        for entry in client.repository_index():
            if entry.get("name") != name:
                continue
            if str(entry.get("version", "")) == str(version):  # an entry per version: this one's state
                reason = f" (state {entry.get('state', '?')}: {entry.get('reason', '') or 'no reason given'})"
            elif entry.get("state") == "READY":
                ready.append(str(entry.get("version")))
    except ServerError:  # the index is only used to explain
        pass
    hint = (f"; the server serves version(s) {', '.join(ready)} of it: check one of those (--version), or serve "
            "this one too (deploy.version_policy: all)" if ready else
            "; load it (triton-builder serve --repository DIR loads every model) and check again")
    raise ServerError(f"model '{name}' version {version} is not ready on {url}{reason}{hint}")


def _tensor_summary(items: list[dict[str, Any]]) -> list[tuple]:
    return [(t.get("name"), t.get("data_type"), [int(d) for d in t.get("dims", [])]) for t in items]


def config_differences(intended: dict[str, Any], loaded: dict[str, Any]) -> list[str]:
    """What Triton loaded vs what the builder wrote, on the fields that change behaviour."""
    differences = []

    def compare(label: str, want: Any, got: Any) -> None:
        if want != got:
            differences.append(f"{label}: intended {want}, loaded {got}")

    compare("max_batch_size", int(intended.get("max_batch_size", 0)), int(loaded.get("max_batch_size", 0)))
    compare("inputs", _tensor_summary(intended.get("input", [])), _tensor_summary(loaded.get("input", [])))
    compare("outputs", _tensor_summary(intended.get("output", [])), _tensor_summary(loaded.get("output", [])))
    want_batching, got_batching = intended.get("dynamic_batching"), loaded.get("dynamic_batching")
    compare("dynamic_batching", want_batching is not None, got_batching is not None)
    if want_batching is not None and got_batching is not None:
        # Triton's auto-complete fills an empty list with [max_batch_size]: the same behaviour
        max_batch = [int(intended.get("max_batch_size", 0))]
        compare("dynamic_batching.preferred_batch_size",
                [int(s) for s in want_batching.get("preferred_batch_size", [])] or max_batch,
                [int(s) for s in got_batching.get("preferred_batch_size", [])] or max_batch)
        compare("dynamic_batching.max_queue_delay_microseconds",
                int(want_batching.get("max_queue_delay_microseconds", 0)),
                int(got_batching.get("max_queue_delay_microseconds", 0)))
    groups = lambda cfg: [(g.get("kind", "KIND_AUTO"), int(g.get("count", 1))) for g in cfg.get("instance_group", [])]  # noqa: E731
    compare("instance_group", groups(intended), groups(loaded))
    return differences
