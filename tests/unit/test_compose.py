"""docker-compose.yml: valid, no default Grafana password, every published port on 127.0.0.1.

`docker-compose config -q` validates the file without a Docker engine. docker-compose comes from
Debian's `docker-compose` package (scripts/install-system-deps.sh): without it the validation tests
are skipped locally, but FAIL when the CI environment variable is set.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_command

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PASSWORD_VAR = "GRAFANA_ADMIN_PASSWORD"
KEY_VAR = "TRITON_BUILDER_CONTROL_KEY"


def _docker_compose() -> str:
    return require_command("docker-compose", "docker-compose")


PYTHON_BACKEND = ROOT / "docker" / "triton" / "python-backend.compose.yml"


def _config(tmp_path: Path, password: str | None, *extra: Path, key: str | None = "only-for-this-test",
            show: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (PASSWORD_VAR, KEY_VAR) and not k.startswith("COMPOSE_")}
    if password is not None:
        env[PASSWORD_VAR] = password
    if key is not None:
        env[KEY_VAR] = key
    empty_env_file = tmp_path / "empty.env"  # so a developer's ./.env cannot provide the password
    empty_env_file.write_text("")
    files = [arg for path in (COMPOSE, *extra) for arg in ("-f", str(path))]
    return subprocess.run([_docker_compose(), "--env-file", str(empty_env_file), *files, "config",
                           *([] if show else ["-q"])],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_config_is_valid_with_a_grafana_password(tmp_path):
    out = _config(tmp_path, "only-for-this-test")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_python_backend_override_is_valid_over_the_stock_file(tmp_path):
    out = _config(tmp_path, "only-for-this-test", PYTHON_BACKEND)
    assert out.returncode == 0, out.stdout + out.stderr


def test_config_fails_without_a_grafana_password(tmp_path):
    out = _config(tmp_path, None)
    assert out.returncode != 0, "docker-compose accepted the file without GRAFANA_ADMIN_PASSWORD (a default password?)"
    assert PASSWORD_VAR in out.stdout + out.stderr, out.stdout + out.stderr


def test_config_fails_without_a_control_key_and_restricts_control_with_it(tmp_path):
    out = _config(tmp_path, "only-for-this-test", key=None)
    assert out.returncode != 0, "docker-compose accepted the file without TRITON_BUILDER_CONTROL_KEY (a default key?)"
    assert KEY_VAR in out.stdout + out.stderr, out.stdout + out.stderr
    out = _config(tmp_path, "only-for-this-test", key="k3y-for-this-test", show=True)
    assert out.returncode == 0, out.stdout + out.stderr
    command = yaml.safe_load(out.stdout)["services"]["triton"]["command"]
    apis = "model-repository,shared-memory,logging,trace:triton-builder-control-key=k3y-for-this-test"
    assert f"--http-restricted-api={apis}" in command and f"--grpc-restricted-protocol={apis}" in command
    # the exporter reads the repository index (restricted): the key in its environment, not its command line
    exporter = yaml.safe_load(out.stdout)["services"]["exporter"]
    assert exporter["environment"][KEY_VAR] == "k3y-for-this-test" and "k3y" not in " ".join(exporter["command"])


def test_the_control_key_has_no_default():
    command = _compose()["services"]["triton"]["command"]
    restricted = [a for a in command if "restricted" in a]
    assert len(restricted) == 2 and all(a.endswith("=${" + KEY_VAR + ":?set " + KEY_VAR
                                                     + " (the model-control key; no default)}") for a in restricted)


def _published_ports(service: dict) -> list:
    return list(service.get("ports") or [])


def test_every_published_port_binds_localhost():
    doc = yaml.safe_load(COMPOSE.read_text())
    seen = 0
    for name, service in doc["services"].items():
        assert service.get("network_mode") != "host", f"service {name} uses the host network"
        for port in _published_ports(service):
            seen += 1
            if isinstance(port, dict):  # long syntax
                assert port.get("host_ip") == "127.0.0.1", f"service {name}: {port}"
            else:
                parts = str(port).split(":")
                assert len(parts) == 3 and parts[0] == "127.0.0.1", \
                    f"service {name}: port {port!r} must be published as 127.0.0.1:HOST:CONTAINER"
    assert seen >= 5, "expected Triton (3), exporter, Prometheus and Grafana ports"


def test_grafana_password_has_no_default():
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    value = str(grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"])
    assert value.startswith("${" + PASSWORD_VAR + ":?"), f"GF_SECURITY_ADMIN_PASSWORD must be required: {value}"


# --------------------------------------------------------------------------------------------
# Derived images: every image compose builds parses, starts FROM a pinned tag, and nothing pip-installs
# at container start; the Triton image is the pinned NGC image plus the python-backend model's packages.

DOCKERFILE_INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
                           "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, backslash continuations joined.
    ValueError naming the file and line for an unknown instruction."""
    out, pending, start = [], "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        start = start or number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text, pending = pending + stripped, ""
        word, _, args = text.partition(" ")
        if word.upper() not in DOCKERFILE_INSTRUCTIONS:
            raise ValueError(f"{path}:{start}: unknown Dockerfile instruction {word!r}")
        out.append((word.upper(), args.strip()))
        start = 0
    if pending:
        raise ValueError(f"{path}: ends inside a continued line")
    return out


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_dockerfile_parser_rejects_unknown_instructions(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN echo a \\\n  && echo b\nINSTALL numpy\n")
    with pytest.raises(ValueError, match=r"Dockerfile:4: unknown Dockerfile instruction 'INSTALL'"):
        parse_dockerfile(bad)
    bad.write_text("FROM python:3.11-slim\nRUN echo a \\\n  && echo b\n")
    assert parse_dockerfile(bad) == [("FROM", "python:3.11-slim"), ("RUN", "echo a  && echo b")]


def test_every_built_image_parses_and_is_pinned():
    built = {name: s["build"] for name, s in _compose()["services"].items() if "build" in s}
    assert set(built) == {"exporter"}  # Triton: the stock image (the python-backend override builds its own)
    built["triton"] = yaml.safe_load(PYTHON_BACKEND.read_text())["services"]["triton"]["build"]
    for name, build in built.items():
        dockerfile = ROOT / build["context"] / build["dockerfile"]
        instructions = parse_dockerfile(dockerfile)
        froms = [args for word, args in instructions if word == "FROM"]
        assert len(froms) == 1, f"{dockerfile}: one FROM expected, got {froms}"
        assert ":" in froms[0] and not froms[0].endswith(":latest"), f"{dockerfile}: FROM {froms[0]} is not pinned"
        # compose copies what the image needs; nothing is mounted over it or installed at start
        service = _compose()["services"][name] | yaml.safe_load(PYTHON_BACKEND.read_text())["services"].get(name, {})
        start = " ".join(map(str, (service.get("entrypoint") or []) + (service.get("command") or [])))
        assert "pip install" not in start, f"service {name} installs packages at start: {start}"
    assert parse_dockerfile(ROOT / "docker" / "locust" / "Dockerfile")[0] == ("FROM", "locustio/locust:2.47.0")


def _defaults(text: str) -> str:
    """Compose / Dockerfile text with each ``${VAR:-default}`` or ``${VAR}`` replaced as an unset environment does."""
    import re

    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def test_triton_is_the_stock_newest_ngc_release_and_the_override_adds_the_python_backend_packages():
    from builder.repository.triton_releases import DEFAULT_RELEASE, python_backend_onnxruntime, triton_release
    from builder.scaleout.k8s import DEFAULT_IMAGE

    doc = _compose()
    pin = _defaults(doc["x-triton-image"])
    assert pin == DEFAULT_IMAGE == "nvcr.io/nvidia/tritonserver:26.08-py3" == triton_release(DEFAULT_RELEASE).image
    assert doc["services"]["build-plans"]["image"] == doc["x-triton-image"]  # trtexec of the same TensorRT
    assert doc["services"]["triton"]["image"] == doc["x-triton-image"] and "build" not in doc["services"]["triton"]
    triton = yaml.safe_load(PYTHON_BACKEND.read_text())["services"]["triton"]
    build_args = {k: _defaults(v) for k, v in triton["build"]["args"].items()}
    assert "${TRITON_RELEASE:-" in doc["x-triton-image"] and build_args["TRITON_RELEASE"] == DEFAULT_RELEASE
    assert _defaults(triton["image"]).startswith(f"triton-builder/tritonserver:{DEFAULT_RELEASE}-py3")
    instructions = parse_dockerfile(ROOT / triton["build"]["dockerfile"])
    args = dict(a.split("=", 1) for word, a in instructions if word == "ARG" and "=" in a)
    froms = [a for word, a in instructions if word == "FROM"]
    assert froms == ["nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3"] and args["TRITON_RELEASE"] == DEFAULT_RELEASE
    # the release's own onnxruntime (python-backend and onnxruntime-backend models load the same), same as compose
    assert args["ONNXRUNTIME_VERSION"] == build_args["ONNXRUNTIME_VERSION"] == \
        python_backend_onnxruntime(triton_release(DEFAULT_RELEASE)), args
    run = " ".join(a for word, a in instructions if word == "RUN")
    assert '"onnxruntime==${ONNXRUNTIME_VERSION}"' in run and "numpy" in run
    assert "import onnxruntime" in run  # the build fails if the module does not import
    # OpenVINO IR python-backend models: openvino on request, the version their metadata.yaml records
    assert args["OPENVINO_VERSION"] == "" and '"openvino==${OPENVINO_VERSION}"' in run and "import openvino" in run


def test_exporter_image_copies_the_exporter_and_its_client_version():
    instructions = parse_dockerfile(ROOT / "docker" / "exporter" / "Dockerfile")
    copied = [a for word, a in instructions if word == "COPY"]
    assert copied == ["monitoring/__init__.py monitoring/exporter.py /app/monitoring/"]
    assert all((ROOT / p).is_file() for p in copied[0].split()[:-1])
    assert any('"prometheus-client==0.26.*"' in a for word, a in instructions if word == "RUN")
    assert "volumes" not in _compose()["services"]["exporter"]


def test_prometheus_compose_config_is_the_local_one_with_service_targets():
    prom = ROOT / "monitoring" / "prometheus"
    local = yaml.safe_load((prom / "prometheus.yml").read_text())
    compose = yaml.safe_load((prom / "prometheus.compose.yml").read_text())
    rename = {"127.0.0.1:8002": "triton:8002", "127.0.0.1:9102": "exporter:9102",
              "127.0.0.1:9093": "alertmanager:9093"}
    renamed = yaml.safe_load(yaml.safe_dump(local))
    for block in [*renamed["scrape_configs"], *renamed["alerting"]["alertmanagers"]]:
        for static in block["static_configs"]:
            static["targets"] = [rename[t] for t in static["targets"]]
    assert compose == renamed
    service = _compose()["services"]["prometheus"]
    assert "./monitoring/prometheus/prometheus.compose.yml:/etc/prometheus/prometheus.yml:ro" in service["volumes"]
    assert "./monitoring/prometheus/rules:/etc/prometheus/rules:ro" in service["volumes"]  # rules/*.yml resolves
    assert "sed" not in " ".join(map(str, (service.get("entrypoint") or []) + service["command"]))


def test_alertmanager_service_mounts_the_shipped_config():
    service = _compose()["services"]["alertmanager"]
    assert service["image"] == "prom/alertmanager:v0.25.0"
    mount = "${ALERTMANAGER_CONFIG:-./monitoring/alertmanager/alertmanager.yml}:/etc/alertmanager/alertmanager.yml:ro"
    assert mount in service["volumes"]
    assert "--cluster.listen-address=" in service["command"]  # no gossip port on every interface
    assert "alertmanager" in _compose()["services"]["prometheus"]["depends_on"]
