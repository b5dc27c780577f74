"""The Kubernetes manifests rendered and validated offline (kubernetes-validate, kustomize where
present), and the `k8s` verb's argument errors. Split from test_scaleout_offline.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from builder.core.errors import UserInputError
from tests.conftest import ROOT, require, run_cli

# --------------------------------------------------------------------------------------------
# Kubernetes manifests


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    require("kubernetes_validate", "k8s")
    from builder.scaleout.k8s import render_manifests

    out = tmp_path_factory.mktemp("k8s")
    render_manifests("s3://models-bucket/prod", out, replicas=2, min_replicas=1, max_replicas=6,
                     metric="queue_compute_ratio", target=0.5, model="digits_cnn", namespace="inference",
                     release="kube-prom")
    return out


def _docs(out: Path) -> dict[str, dict]:
    docs = {}
    for path in sorted((out / "base").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc and doc["kind"] != "Kustomization":
                docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def test_manifests_render_and_validate(manifests):
    from builder.scaleout.k8s import validate_manifests

    assert validate_manifests(manifests) == []
    docs = _docs(manifests)
    assert {"Deployment/triton", "Service/triton", "HorizontalPodAutoscaler/triton", "PodMonitor/triton",
            "ConfigMap/triton-prometheus-adapter-rules", "PrometheusRule/triton-rules",
            "ConfigMap/triton-grafana-dashboards", "Deployment/locust-master", "Deployment/locust-worker",
            "Service/locust-master", "ConfigMap/locust-files"} <= set(docs)
    assert not any(key.startswith("Secret/") for key in docs)

    triton = docs["Deployment/triton"]["spec"]["template"]["spec"]["containers"][0]
    assert "--model-repository=s3://models-bucket/prod" in triton["args"]
    assert "--model-control-mode=poll" in triton["args"]
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    secret_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in triton["env"] if "valueFrom" in e}
    assert secret_refs["AWS_ACCESS_KEY_ID"]["name"] == "triton-s3-credentials"
    assert all("value" not in e for e in triton["env"] if e["name"].startswith("AWS_SECRET"))
    # model control needs the key of a Secret that is referenced (the kubelet expands $(VAR)), never rendered
    apis = "model-repository,shared-memory,logging,trace:triton-builder-control-key=$(TRITON_BUILDER_CONTROL_KEY)"
    assert [a for a in triton["args"] if "restricted" in a] == [f"--http-restricted-api={apis}",
                                                                 f"--grpc-restricted-protocol={apis}"]
    assert secret_refs["TRITON_BUILDER_CONTROL_KEY"] == {"name": "triton-builder-control-key",
                                                         "key": "TRITON_BUILDER_CONTROL_KEY"}
    deployment = (manifests / "base" / "triton-deployment.yaml").read_text()
    assert "kubectl -n inference create secret generic triton-builder-control-key" in deployment

    hpa = docs["HorizontalPodAutoscaler/triton"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 6)
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "triton_queue_compute_ratio"
    assert hpa["metrics"][0]["pods"]["target"]["averageValue"] == "500m"
    adapter = yaml.safe_load(docs["ConfigMap/triton-prometheus-adapter-rules"]["data"]["config.yaml"])
    assert {r["name"]["as"] for r in adapter["rules"]} == {"triton_queue_compute_ratio", "triton_pending_requests"}

    # generated from monitoring/: the PrometheusRule (a CRD: kubernetes-validate does not know it) holds the
    # rule files' groups, labelled for kube-prometheus-stack's ruleSelector like the PodMonitor
    rule = docs["PrometheusRule/triton-rules"]
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prom"
    assert docs["PodMonitor/triton"]["metadata"]["labels"]["release"] == "kube-prom"
    groups = [g for path in sorted((ROOT / "monitoring" / "prometheus" / "rules").glob("*.yml"))
              for g in yaml.safe_load(path.read_text())["groups"]]
    assert rule["spec"]["groups"] == groups and len(groups) >= 2
    dashboards = docs["ConfigMap/triton-grafana-dashboards"]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = dashboards["data"]["triton.json"]
    assert dashboard == (ROOT / "monitoring" / "grafana" / "dashboards" / "triton.json").read_text()
    panels = json.loads(dashboard)["panels"]
    assert {t["datasource"]["uid"] for p in panels for t in p.get("targets", [])} == {"${datasource}"}
    # Locust runs an image with its packages baked in: nothing is installed when a pod starts
    for name in ("locust-master", "locust-worker"):
        container = docs[f"Deployment/{name}"]["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "triton-builder-locust:2.47.0"
        assert "pip" not in " ".join(container["args"]), container["args"]
    for name in ("locustfile.py", "shapes.py", "triton_target.py"):  # the locustfile imports the other two
        assert docs["ConfigMap/locust-files"]["data"][name] == (ROOT / "loadtest" / name).read_text()
    kustomization = yaml.safe_load((manifests / "base" / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "inference"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds_the_base(manifests):
    import subprocess

    built = subprocess.run(["kubectl", "kustomize", str(manifests / "base")], capture_output=True, text=True,
                           timeout=120)
    assert built.returncode == 0, built.stderr
    objects = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert all(d["metadata"].get("namespace") == "inference" for d in objects)
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "triton-builder" for d in objects)


def test_validation_catches_broken_manifests(manifests, tmp_path):
    from builder.scaleout.k8s import validate_manifests

    broken = tmp_path / "broken"
    shutil.copytree(manifests, broken)
    service = broken / "base" / "triton-service.yaml"
    service.write_text(service.read_text().replace("  type: ClusterIP", "  type: ClusterIP\n  typo: 1", 1))
    hpa = broken / "base" / "triton-hpa.yaml"
    hpa.write_text(hpa.read_text().replace("name: triton_queue_compute_ratio", "name: made_up_metric"))
    monitor = broken / "base" / "triton-podmonitor.yaml"
    monitor.write_text(monitor.read_text().replace("- port: metrics", "- port: nope"))
    rules = broken / "base" / "prometheus-rules.yaml"
    rules.write_text(rules.read_text().replace("- alert: TritonTargetDown", "- alarm: TritonTargetDown", 1))
    problems = "\n".join(validate_manifests(broken, use_kubectl=False))
    assert "Additional properties are not allowed ('typo' was unexpected)" in problems
    assert "made_up_metric has no prometheus-adapter rule" in problems
    assert "scrapes port 'nope'" in problems
    assert "group 'triton-builder-availability': rule" in problems and "exactly one of alert / record" in problems


@pytest.mark.parametrize("kwargs, message", [
    (dict(min_replicas=3, max_replicas=2), "--max-replicas 2: must be >= --min-replicas 3"),
    (dict(replicas=9, max_replicas=8), "--replicas 9: must lie within"),
    (dict(metric="cpu"), "--metric 'cpu': use one of queue_compute_ratio, pending_requests"),
    (dict(target=0), "--target 0"),
    (dict(namespace="Bad_NS"), "--namespace 'Bad_NS'"),
    (dict(model="../x"), "--model"),
    (dict(release="bad release"), "--release 'bad release': not a valid label value"),
])
def test_k8s_argument_errors(tmp_path, kwargs, message):
    from builder.scaleout.k8s import render_manifests

    with pytest.raises(UserInputError) as err:
        render_manifests("s3://models-bucket/prod", tmp_path, **kwargs)
    assert message in str(err.value)
    with pytest.raises(UserInputError, match="--repository-url"):
        render_manifests("models-bucket/prod", tmp_path)


def test_k8s_cli_renders_and_validates(tmp_path):
    require("kubernetes_validate", "k8s")
    result = run_cli("k8s", "--repository-url", "s3://127.0.0.1:9000/models/prod", "--out", str(tmp_path),
                     "--metric", "pending_requests", "--gpus", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validated offline" in result.stdout and "0 replicas" in result.stdout  # no --model: Locust off
    docs = _docs(tmp_path)
    triton = docs["Deployment/triton"]["spec"]["template"]["spec"]["containers"][0]
    assert "--model-repository=s3://http://127.0.0.1:9000/models/prod" in triton["args"]
    assert "nvidia.com/gpu" not in triton["resources"].get("limits", {})
    assert docs["HorizontalPodAutoscaler/triton"]["spec"]["metrics"][0]["pods"]["metric"]["name"] == \
        "triton_pending_requests"
    assert docs["Deployment/locust-master"]["spec"]["replicas"] == 0
    assert "no --release given" in result.stdout
    result = run_cli("k8s", "--repository-url", "s3://models/prod", "--out", str(tmp_path / "r"), "--release",
                     "monitoring", "--locust-image", "registry.local/locust:1", "--no-validate")
    assert result.returncode == 0, result.stdout + result.stderr
    docs = _docs(tmp_path / "r")
    assert docs["PrometheusRule/triton-rules"]["metadata"]["labels"]["release"] == "monitoring"
    assert docs["Deployment/locust-worker"]["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "registry.local/locust:1"


