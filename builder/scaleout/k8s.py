"""`triton-builder k8s`: Kubernetes manifests for Triton replicas on an object-store model repository,
autoscaled on Triton's own metrics, monitored and load-testable. Rendered from templates/k8s/base/
(Jinja2) into a kustomize base; validated offline.

Usage::

    result = render_manifests("s3://models-bucket/prod", "deploy/k8s", replicas=2, min_replicas=1,
                              max_replicas=8, metric="queue_compute_ratio", target=1.0, model="digits_cnn")
    result.files            # the YAML files written under deploy/k8s/base/
    problems = validate_manifests("deploy/k8s")   # [] when every check passes

What is rendered (``<out>/base/``):

- ``triton-deployment.yaml``: Triton (NGC image) with ``--model-repository`` pointing at the bucket,
  AWS credentials from a Secret that is referenced, never generated; model control, the repository
  index, shared memory, logging and trace restricted to requests with the key of the Secret
  ``triton-builder-control-key`` (key ``TRITON_BUILDER_CONTROL_KEY``, referenced in the args as
  ``$(TRITON_BUILDER_CONTROL_KEY)``, never generated: ``kubectl create secret generic``); readiness on
  ``/v2/health/ready``, liveness (and start-up) on ``/v2/health/live``; GPUs requested with
  ``nvidia.com/gpu``; poll model control by default, so a version ``triton-builder publish`` makes
  visible (its config.pbtxt written last) is loaded by every pod without a restart.
- ``triton-service.yaml``: the ClusterIP Service (HTTP, gRPC, metrics) and a headless one for gRPC.
- ``triton-hpa.yaml``: an autoscaling/v2 HorizontalPodAutoscaler on a per-pod custom metric:
  ``triton_queue_compute_ratio`` (queue time over compute time) or ``triton_pending_requests``.
- ``prometheus-adapter-config.yaml``: the prometheus-adapter rules that serve those two metrics.
- ``triton-podmonitor.yaml``: a Prometheus Operator PodMonitor for every Triton pod.
- ``prometheus-rules.yaml``: a Prometheus Operator PrometheusRule whose groups are those of
  monitoring/prometheus/rules/*.yml; ``release`` (kube-prometheus-stack's Helm release) labels it and
  the PodMonitor so that stack's Prometheus selects them.
- ``grafana-dashboards.yaml``: monitoring/grafana/dashboards/*.json in a ConfigMap labelled
  ``grafana_dashboard: "1"`` for Grafana's dashboard sidecar; the panels use the ``${datasource}`` variable.
- ``locust.yaml``: loadtest/locustfile.py in a ConfigMap, a Locust master (Deployment + Service) and
  worker Deployment running ``locust_image`` (docker/locust/Dockerfile: packages baked in, nothing
  installed at start).
- ``kustomization.yaml`` listing them.

``validate_manifests`` checks every core object against the Kubernetes OpenAPI schemas shipped by
``kubernetes-validate`` (strict: unknown fields are errors), the CRD objects (PodMonitor) by
structure, the references between objects (selectors, ports, HPA target, adapter metric names,
Secret never defined), and, where ``kubectl`` is installed, that ``kubectl kustomize`` builds the base.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core import assets
from builder.core.errors import UserInputError
from builder.core.extras import require
from builder.core.processes import run_command
from builder.repository.triton_releases import DEFAULT_RELEASE, RELEASES
from builder.serving import control_key as control
from builder.spec.model import validate_model_name
from builder.storage.s3 import parse_s3_url

__all__ = ["METRICS", "render_manifests", "validate_manifests", "require_validator", "RenderResult", "DEFAULT_IMAGE"]

DEFAULT_IMAGE = RELEASES[DEFAULT_RELEASE].image  # the newest release in the table, as docker-compose.yml
DEFAULT_LOCUST_IMAGE = "triton-builder-locust:2.47.0"  # docker/locust/Dockerfile, pushed where the cluster pulls
KUBERNETES_VERSION = "1.32.0"
CRD_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
#: the Secret holding the model-control key (builder/serving/control_key.py): referenced, never rendered
CONTROL_SECRET = "triton-builder-control-key"

#: metric -> (custom metric name, what it is, default per-pod target)
METRICS: dict[str, tuple[str, str, float]] = {
    "queue_compute_ratio": ("triton_queue_compute_ratio",
                            "the ratio of time requests wait in Triton's queue to the time they compute", 1.0),
    "pending_requests": ("triton_pending_requests", "requests pending in Triton (queued, not yet executing)", 8.0),
}

_ADAPTER_RULES = [
    {
        "seriesQuery": 'nv_inference_queue_duration_us{namespace!="",pod!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": "^nv_inference_queue_duration_us$", "as": "triton_queue_compute_ratio"},
        # queue time over compute time per pod over 1m; 0 when idle (the denominator is clamped to 1 us/s)
        "metricsQuery": (
            "sum by (<<.GroupBy>>) (rate(nv_inference_queue_duration_us{<<.LabelMatchers>>}[1m]))\n"
            "/ clamp_min(\n"
            "    sum by (<<.GroupBy>>) (rate(nv_inference_compute_input_duration_us{<<.LabelMatchers>>}[1m]))\n"
            "  + sum by (<<.GroupBy>>) (rate(nv_inference_compute_infer_duration_us{<<.LabelMatchers>>}[1m]))\n"
            "  + sum by (<<.GroupBy>>) (rate(nv_inference_compute_output_duration_us{<<.LabelMatchers>>}[1m])),\n"
            "  1)\n"),
    },
    {
        "seriesQuery": 'nv_inference_pending_request_count{namespace!="",pod!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": "^nv_inference_pending_request_count$", "as": "triton_pending_requests"},
        "metricsQuery": "sum by (<<.GroupBy>>) (nv_inference_pending_request_count{<<.LabelMatchers>>})",
    },
]


# An image reference as container runtimes parse it (distribution/reference's grammar): [domain[:port]/]
# lowercase path components, an optional tag, an optional digest. Kubernetes' own schema takes any string,
# so a bad one would validate here and fail only when a node pulls it (ErrImagePull / InvalidImageName).
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"^{_DOMAIN}?{_PATH}(?:/{_PATH})*(?::[\w][\w.-]{{0,127}})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
_LOOPBACK = ("localhost", "127.", "0.0.0.0", "[::1]", "::1")


def check_image(image: str, flag: str) -> None:
    """``UserInputError`` naming ``flag`` unless ``image`` is a valid image reference."""
    if not _IMAGE.match(image or "") or len(image.split("@")[0].rsplit(":", 1)[0]) > 255:
        raise UserInputError(f"{flag} {image!r}: not a valid image reference; use [REGISTRY[:PORT]/]NAME[:TAG]"
                             f"[@sha256:DIGEST] with a lowercase NAME and no spaces, e.g. {DEFAULT_IMAGE}")


def loopback_warning(location) -> str | None:
    """A warning when the repository URL's endpoint is this machine's loopback: in a pod it is the pod."""
    if location.endpoint is None:
        return None
    host = location.endpoint.split("://", 1)[1].rsplit(":", 1)[0]
    if host != "localhost" and not host.startswith(_LOOPBACK):
        return None
    return (f"warning: --repository-url {location.url}: inside a pod, {host} is the pod itself, not this machine, "
            "so Triton there will not reach the bucket; use an endpoint the cluster can reach (a Service's DNS "
            "name, a routable host or IP) or AWS S3 (s3://BUCKET/PREFIX)")


@dataclass
class RenderResult:
    out: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"wrote {len(self.files)} files to {self.out / 'base'}:"]
        out += [f"  {p.name}" for p in self.files]
        out += self.notes
        return out


def _yaml_block(data: dict[str, str]) -> str:
    """ConfigMap ``data`` entries as YAML, multi-line values as literal blocks where YAML allows."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True).rstrip("\n")


def _quantity(value: float) -> str:
    """A Kubernetes quantity for a per-pod target: "2", "500m"."""
    if float(value).is_integer():
        return str(int(value))
    return f"{int(round(value * 1000))}m"


def _check_args(replicas: int, min_replicas: int, max_replicas: int, metric: str, target: float | None,
                gpus: int, locust_workers: int, poll_seconds: int, model_control: str, namespace: str | None,
                secret_name: str) -> None:
    if min_replicas < 1:
        raise UserInputError(f"--min-replicas {min_replicas}: must be >= 1")
    if max_replicas < min_replicas:
        raise UserInputError(f"--max-replicas {max_replicas}: must be >= --min-replicas {min_replicas}")
    if not min_replicas <= replicas <= max_replicas:
        raise UserInputError(f"--replicas {replicas}: must lie within --min-replicas {min_replicas} and "
                             f"--max-replicas {max_replicas}")
    if metric not in METRICS:
        raise UserInputError(f"--metric {metric!r}: use one of {', '.join(METRICS)}")
    if target is not None and target <= 0:
        raise UserInputError(f"--target {target}: must be > 0 (the per-pod average the autoscaler aims at)")
    if gpus < 0:
        raise UserInputError(f"--gpus {gpus}: must be >= 0 (0: no GPU requested)")
    if locust_workers < 0:
        raise UserInputError(f"--locust-workers {locust_workers}: must be >= 0")
    if poll_seconds < 1:
        raise UserInputError(f"--poll-seconds {poll_seconds}: must be >= 1")
    if model_control not in ("poll", "explicit"):
        raise UserInputError(f"--model-control {model_control!r}: use poll or explicit")
    dns = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
    if namespace is not None and not dns.match(namespace):
        raise UserInputError(f"--namespace {namespace!r}: use a DNS label (lowercase letters, digits, '-')")
    if not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z", secret_name):
        raise UserInputError(f"--secret {secret_name!r}: not a valid Secret name (lowercase letters, digits, '-', '.')")


def render_manifests(repository_url: str, out: str | Path, *, replicas: int = 2, min_replicas: int = 1,
                     max_replicas: int = 8, metric: str = "queue_compute_ratio", target: float | None = None,
                     namespace: str | None = None, image: str = DEFAULT_IMAGE, secret_name: str = "triton-s3-credentials",
                     region: str = "us-east-1", gpus: int = 1, model: str | None = None, locust_workers: int = 2,
                     locust_protocol: str = "http", locust_image: str = DEFAULT_LOCUST_IMAGE,
                     model_control: str = "poll", poll_seconds: int = 30, cpu: str = "2", memory: str = "8Gi",
                     memory_limit: str = "16Gi", monitor_labels: dict[str, str] | None = None,
                     scrape_interval: str = "15s", release: str | None = None) -> RenderResult:
    """Render the kustomize base into ``out/base``; see the module doc. ``UserInputError`` for bad arguments."""
    import jinja2
    import yaml


    location = parse_s3_url(repository_url, "--repository-url")
    _check_args(replicas, min_replicas, max_replicas, metric, target, gpus, locust_workers, poll_seconds,
                model_control, namespace, secret_name)
    if model is not None:
        validate_model_name(model, "--model")
    if locust_protocol not in ("http", "grpc"):
        raise UserInputError(f"--locust-protocol {locust_protocol!r}: use http or grpc")
    check_image(image, "--image")
    check_image(locust_image, "--locust-image")
    monitor_labels = dict(monitor_labels or {})
    if release is not None:
        if not re.match(r"^[a-z0-9A-Z]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?\Z", release):
            raise UserInputError(f"--release {release!r}: not a valid label value (letters, digits, '-', '_', '.'; "
                                 "the Helm release name of kube-prometheus-stack)")
        monitor_labels["release"] = release
    metric_name, metric_help, default_target = METRICS[metric]
    target = default_target if target is None else float(target)

    out = Path(out).expanduser().resolve()
    base = out / "base"
    if base.exists() and any(base.iterdir()) and not (base / "kustomization.yaml").is_file():
        raise UserInputError(f"--out {out}: {base} exists and is not a base rendered by triton-builder; choose "
                             "another folder")
    base.mkdir(parents=True, exist_ok=True)

    triton_args = [f"--model-repository={location.triton_url(from_env=False)}",
                   f"--model-control-mode={model_control}", "--strict-readiness=true", "--exit-on-error=false",
                   "--metrics-config=summary_latencies=true", "--http-port=8000", "--grpc-port=8001",
                   "--metrics-port=8002"] + control.server_args(f"$({control.ENV})")  # kubelet expands it
    if model_control == "poll":
        triton_args.insert(2, f"--repository-poll-secs={poll_seconds}")
        control_note = (f"Poll mode: every {poll_seconds} s each pod re-reads the bucket and loads the versions "
                        "config.pbtxt names (publish writes it last, after every file and the .complete marker).")
    else:
        triton_args.insert(2, "--load-model=*")
        control_note = ("Explicit mode: pods load what config.pbtxt names at start; roll a new version out with "
                        "`kubectl rollout restart deployment/triton` (maxUnavailable 0, readiness-gated).")

    monitoring, loadtest = assets.monitoring_dir(), assets.loadtest_dir()
    rule_groups = [group for p in sorted((monitoring / "prometheus" / "rules").glob("*.yml"))
                   for group in (yaml.safe_load(p.read_text(encoding="utf-8")) or {}).get("groups") or []]
    dashboards = {p.name: p.read_text(encoding="utf-8")
                  for p in sorted((monitoring / "grafana" / "dashboards").glob("*.json"))}
    locust_files = {name: (loadtest / name).read_text(encoding="utf-8")
                    for name in ("locustfile.py", "shapes.py", "triton_target.py")}
    notes = [warning] if (warning := loopback_warning(location)) else []
    host = "triton:8000" if locust_protocol == "http" else "triton:8001"
    files_arg = "-f /locust/locustfile.py,/locust/shapes.py,/locust/triton_target.py"
    master_command = (f"exec locust {files_arg} --master --host {host} "
                      f"--triton-protocol {locust_protocol} --web-host 0.0.0.0 --web-port 8089")
    worker_command = f"exec locust {files_arg} --worker --master-host locust-master --master-port 5557"
    if not monitor_labels.get("release"):
        notes.append("note: no --release given: kube-prometheus-stack's Prometheus selects PodMonitors and "
                     "PrometheusRules labelled release=<its Helm release>; render with --release NAME")
    if model is None:
        locust_note = ("No --model was given: the Locust Deployments have 0 replicas; set TRITON_MODEL and scale "
                       "them up (or render again with --model NAME).")
        notes.append("note: no --model given, so the Locust deployments are rendered with 0 replicas")
    else:
        locust_note = f"Model under test: {model} (env TRITON_MODEL)."

    loader = jinja2.FileSystemLoader(str(assets.templates_dir() / "k8s" / "base"))
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = lambda value: json.dumps(value)
    context: dict[str, Any] = dict(
        repository_url=location.url, namespace=namespace, replicas=replicas, min_replicas=min_replicas,
        max_replicas=max_replicas, metric_name=metric_name, metric_help=metric_help, target=target,
        target_quantity=_quantity(target), image=image, secret_name=secret_name, region=region, gpus=gpus,
        control_secret=CONTROL_SECRET, control_env=control.ENV, control_header=control.HEADER,
        triton_args=triton_args, control_note=control_note, cpu=cpu, memory=memory, memory_limit=memory_limit,
        monitor_labels=monitor_labels, scrape_interval=scrape_interval,
        adapter_data=_yaml_block({"config.yaml": _yaml_dump({"rules": _ADAPTER_RULES})}),
        rules_spec=_yaml_block({"groups": rule_groups}), dashboards_data=_yaml_block(dashboards),
        locust_data=_yaml_block(locust_files), model=model or "", locust_image=locust_image,
        locust_protocol=locust_protocol, locust_workers=locust_workers, locust_note=locust_note,
        locust_master_replicas=1 if model else 0, locust_worker_replicas=locust_workers if model else 0,
        locust_master_command=master_command, locust_worker_command=worker_command,
    )
    order = ["triton-deployment.yaml", "triton-service.yaml", "triton-hpa.yaml", "prometheus-adapter-config.yaml",
             "triton-podmonitor.yaml", "prometheus-rules.yaml", "grafana-dashboards.yaml", "locust.yaml"]
    context["resources"] = order
    written = []
    for name in order + ["kustomization.yaml"]:
        text = env.get_template(name + ".j2").render(**context)
        path = base / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return RenderResult(out=out, files=written, notes=notes)


def _yaml_dump(value: Any) -> str:
    return _yaml_block(value) + "\n"


# --------------------------------------------------------------------------------------------
# Offline validation


def _documents(base: Path) -> list[tuple[str, dict]]:
    import yaml

    docs = []
    for path in sorted(base.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs.append((path.name, doc))
    return docs


def _structural_crd(where: str, doc: dict, pod_labels: dict[str, str], ports: set[str]) -> list[str]:
    problems = []
    kind = doc.get("kind")
    if doc.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"{where}: {kind} apiVersion must be monitoring.coreos.com/v1, is {doc.get('apiVersion')}")
    if not (doc.get("metadata") or {}).get("name"):
        problems.append(f"{where}: {kind} has no metadata.name")
    spec = doc.get("spec") or {}
    if kind in ("PodMonitor", "ServiceMonitor"):
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
            problems.append(f"{where}: {kind} selector {selector} does not select the Triton pods {pod_labels}")
        endpoints = spec.get("podMetricsEndpoints" if kind == "PodMonitor" else "endpoints") or []
        if not endpoints:
            problems.append(f"{where}: {kind} has no endpoints to scrape")
        for endpoint in endpoints:
            if endpoint.get("port") not in ports:
                problems.append(f"{where}: {kind} scrapes port {endpoint.get('port')!r}, not one of {sorted(ports)}")
    if kind == "PrometheusRule":
        groups = spec.get("groups") or []
        if not groups:
            problems.append(f"{where}: PrometheusRule has no spec.groups")
        for group in groups:
            rules = group.get("rules") or []
            if not group.get("name") or not rules:
                problems.append(f"{where}: PrometheusRule group {group.get('name')!r} needs a name and rules")
            for rule in rules:
                if not rule.get("expr") or bool(rule.get("alert")) == bool(rule.get("record")):
                    problems.append(f"{where}: group {group.get('name')!r}: rule {rule} needs expr and exactly "
                                    "one of alert / record")
    return problems


def require_validator():
    """The ``kubernetes_validate`` module; UserInputError naming the ``k8s`` extra when it is missing."""
    return require("kubernetes_validate", "the 'k8s' verb", hint="or render without validating: --no-validate")


def validate_manifests(out: str | Path, kubernetes_version: str = KUBERNETES_VERSION,
                       use_kubectl: bool = True) -> list[str]:
    """Every problem found in ``out/base`` (empty list: valid); see the module doc."""
    import yaml

    base = Path(out).expanduser().resolve() / "base"
    if not (base / "kustomization.yaml").is_file():
        raise UserInputError(f"{base}/kustomization.yaml is missing: render the manifests first (triton-builder k8s)")
    kubernetes_validate = require_validator()

    problems: list[str] = []
    docs = _documents(base)
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    listed = set(kustomization.get("resources") or [])
    present = {p.name for p in base.glob("*.yaml")} - {"kustomization.yaml"}
    if listed != present:
        problems.append(f"kustomization.yaml lists {sorted(listed)} but the base holds {sorted(present)}")

    by_kind: dict[str, list[dict]] = {}
    for _where, doc in docs:
        by_kind.setdefault(doc.get("kind", "?"), []).append(doc)
    deployments = {d["metadata"]["name"]: d for d in by_kind.get("Deployment", [])}
    triton = deployments.get("triton")
    pod_labels: dict[str, str] = {}
    ports: set[str] = set()
    if triton is None:
        problems.append("no Deployment named triton")
    else:
        pod_labels = triton["spec"]["template"]["metadata"].get("labels", {})
        container = triton["spec"]["template"]["spec"]["containers"][0]
        ports = {p.get("name") for p in container.get("ports", [])}
        for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
            got = ((container.get(probe) or {}).get("httpGet") or {}).get("path")
            if got != path:
                problems.append(f"triton {probe} checks {got!r}, expected {path}")
        refs = [e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
        if not {r["key"] for r in refs} >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}:
            problems.append("triton does not take AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from a Secret")
        key_refs = [r for e in container.get("env", []) if e.get("name") == control.ENV
                    for r in [(e.get("valueFrom") or {}).get("secretKeyRef")] if r]
        if not key_refs or any(f"$({control.ENV})" not in str(a) for a in container.get("args", [])
                               if "restricted" in str(a)) or \
                sum("restricted" in str(a) for a in container.get("args", [])) != 2:
            problems.append(f"triton does not restrict model control to ${control.ENV} from a Secret")
        if not any(str(a).startswith("--model-repository=s3://") for a in container.get("args", [])):
            problems.append("triton's --model-repository is not an s3:// URL")
    if by_kind.get("Secret"):
        problems.append("a Secret is defined in the base: credentials must be referenced, never generated")

    for where, doc in docs:
        kind = doc.get("kind")
        name = (doc.get("metadata") or {}).get("name")
        if kind in CRD_KINDS:
            problems += _structural_crd(f"{where} {kind}/{name}", doc, pod_labels, ports)
            continue
        try:
            kubernetes_validate.validate(doc, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            problems.append(f"{where} {kind}/{name}: {path}: {err.message}")
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as err:
            problems.append(f"{where} {kind}/{name}: {getattr(err, 'message', err)}")

    for service in by_kind.get("Service", []):
        selector = service["spec"].get("selector", {})
        matched = [d for d in deployments.values()
                   if all(d["spec"]["template"]["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]
        if not matched:
            problems.append(f"Service {service['metadata']['name']} selects no Deployment's pods ({selector})")
    adapter_names = set()
    for cm in by_kind.get("ConfigMap", []):
        if "config.yaml" in (cm.get("data") or {}) and cm["metadata"]["name"].endswith("adapter-rules"):
            for rule in (yaml.safe_load(cm["data"]["config.yaml"]) or {}).get("rules", []):
                adapter_names.add(rule.get("name", {}).get("as"))
    for hpa in by_kind.get("HorizontalPodAutoscaler", []):
        ref = hpa["spec"]["scaleTargetRef"]
        if ref.get("kind") != "Deployment" or ref.get("name") not in deployments:
            problems.append(f"HPA {hpa['metadata']['name']} scales {ref}, which is not rendered here")
        for m in hpa["spec"].get("metrics", []):
            if m.get("type") == "Pods" and m["pods"]["metric"]["name"] not in adapter_names:
                problems.append(f"HPA metric {m['pods']['metric']['name']} has no prometheus-adapter rule "
                                f"(rules serve: {sorted(n for n in adapter_names if n)})")
    if use_kubectl and shutil.which("kubectl"):
        built = run_command(["kubectl", "kustomize", str(base)], timeout=120)
        if built.returncode != 0:
            problems.append(f"kubectl kustomize {base} failed: {built.stderr.strip()[:500]}")
        else:
            count = len([d for d in yaml.safe_load_all(built.stdout) if d])
            if count != len(docs):
                problems.append(f"kubectl kustomize built {count} objects, the base has {len(docs)}")
    return problems
