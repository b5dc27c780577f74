"""MLflow's model registry: register a published version, and materialise ``models:/NAME/VERSION`` (or
``models:/NAME@ALIAS``) back into a local model repository that ``validate`` and ``serve`` take.

Spoken over MLflow's REST API (tracking, model registry, and the server's artifact proxy), so no
MLflow client enters triton-builder's environment (mlflow 3 wants numpy 2; nvidia-pytriton pins
numpy<2). ``MlflowServer`` runs a real ``mlflow server`` (sqlite backend, artifacts served by the
server, 127.0.0.1) from its own cached virtualenv (``~/.cache/triton-builder/tools/mlflow-X``).

What a registered version carries: the version folder and its config.pbtxt as run artifacts under
``model/`` (the version's own signed copy where it has one: the model folder's config.pbtxt is the
latest version's; see register_version); metrics (accuracy, accuracy drop, batch-1 latency, best
throughput); tags (the host profile and the variant table as JSON, the triton-builder model name and
version, which config was attached). The registry version's source is that ``model/`` folder. A
version is checked before anything is sent, and one already registered with the same content is not
registered twice.

Usage::

    with MlflowServer(tmp / "mlflow") as server:
        registered = register_version(server.url, Path("model_repository/digits_cnn"), alias="prod")
        model_folder = materialise("models:/digits_cnn@prod", server.url, cache=tmp / "registry")
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from builder.core.errors import ServerError, UserInputError
from builder.core.processes import LocalService, free_port, http_get
from builder.core.side_env import cache_root, cached_virtualenv
from builder.repository.config import parse_config
from builder.repository.interface import version_mismatch
from builder.repository.layout import existing_versions, latest_version
from builder.repository.metadata import read_metadata
from builder.repository.signing import SIGNED_CONFIG
from builder.repository.warmup_data import referenced_files
from builder.storage.s3 import local_version_files

MLFLOW_VERSION = "3.17.2"
EXPERIMENT = "triton-builder"
REGISTRY_ENV = "MLFLOW_TRACKING_URI"
TAG_LIMIT = 5000  # MLflow's tag value limit (older servers)


def mlflow_python(progress: Callable[[str], object] = lambda m: None) -> Path:
    """The interpreter of a cached virtualenv with mlflow==MLFLOW_VERSION (builder/core/side_env.py; built on
    first use)."""

    home = cache_root() / "tools" / f"mlflow-{MLFLOW_VERSION}"
    if not (home / "ready").is_file():
        progress(f"installing mlflow {MLFLOW_VERSION} into {home} (once) ...")
    try:
        return cached_virtualenv(home, [f"mlflow=={MLFLOW_VERSION}"], 900)
    except Exception as err:  # noqa: BLE001
        raise ServerError(f"could not install mlflow {MLFLOW_VERSION} into {home}: {err}") from None


class MlflowServer(LocalService):
    """``mlflow server`` on 127.0.0.1: sqlite backend store and served artifacts under ``store``."""

    label = "the MLflow server"
    error = ServerError
    stop_timeout = 10.0

    def __init__(self, store: Path | str, host: str = "127.0.0.1", ready_timeout: float = 120.0):
        super().__init__(host, ready_timeout)
        self.store = Path(store).resolve()
        self._port: int | None = None
        self._python: Path | None = None
        self.log_path = self.store / "mlflow-server.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def _prepare(self) -> None:
        self._python = mlflow_python()
        self.store.mkdir(parents=True, exist_ok=True)
        self._port = free_port(self.host)

    def _command(self) -> list[str]:
        return [str(self._python), "-m", "mlflow", "server", "--backend-store-uri",
                f"sqlite:///{self.store / 'mlflow.db'}", "--artifacts-destination", str(self.store / "artifacts"),
                "--host", self.host, "--port", str(self._port), "--workers", "1"]

    def _env(self) -> dict[str, str]:
        return dict(os.environ, PYTHONUNBUFFERED="1")

    def _ready(self) -> bool:
        status, _ = http_get(f"{self.url}/health", timeout=1)
        return status == 200

    def _exit_error(self, code: int) -> Exception:
        return ServerError(f"the MLflow server exited with code {code} while starting: {self._tail()}")

    def _timeout_error(self) -> Exception:
        return ServerError(f"the MLflow server did not answer on {self.url} within {self.ready_timeout:g} s: "
                           f"{self._tail()}")

    def _tail(self) -> str:
        return " | ".join(self.read_log(0).strip().splitlines()[-8:]) or "(no output)"


class _Rest:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._open = urllib.request.build_opener(urllib.request.ProxyHandler({})).open

    def call(self, method: str, path: str, body: Any = None, query: dict | None = None, raw: bool = False) -> Any:
        target = f"{self.url}/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(target, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with self._open(request, timeout=60) as response:
                payload = response.read()
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            raise ServerError(f"MLflow at {self.url}: {method} {path} -> HTTP {err.code}: {text[:300]}") from None
        except (urllib.error.URLError, OSError) as err:
            raise UserInputError(f"--registry {self.url}: no MLflow server answers there ({err}); start one "
                                 "(mlflow server) or set MLFLOW_TRACKING_URI") from None
        return payload if raw else (json.loads(payload) if payload else {})


def _artifact_root(run: dict) -> str:
    uri = run["info"]["artifact_uri"]
    if not uri.startswith("mlflow-artifacts:/"):
        raise ServerError(f"MLflow run artifacts at {uri}: triton-builder needs a server that serves artifacts "
                          "(mlflow server --serve-artifacts, the default)")
    return uri[len("mlflow-artifacts:/"):].lstrip("/")


def _registry_given(registry: str | None, where: str = "--registry") -> str:
    """The registry URL as given (or $MLFLOW_TRACKING_URI), checked for form only: nothing is asked of it."""
    url = registry or os.environ.get(REGISTRY_ENV)
    if not url:
        raise UserInputError(f"{where}: which MLflow server? pass --registry URL or set ${REGISTRY_ENV}")
    if not url.startswith(("http://", "https://")):
        # MLflow's own client also takes file:/sqlite: stores; triton-builder speaks only its REST API
        raise UserInputError(f"{where} {url}: only http(s) MLflow tracking servers are supported; give the MLflow "
                             "server's http(s):// URL (e.g. http://127.0.0.1:5000), or serve a local store with "
                             "`mlflow server --backend-store-uri <store>`")
    return url


def registry_url(registry: str | None, where: str = "--registry") -> str:
    """The MLflow server to talk to: ``registry``, else $MLFLOW_TRACKING_URI; checked to answer, so a build
    that registers fails before it writes anything rather than after it published."""
    url = _registry_given(registry, where)
    status, _ = http_get(f"{url.rstrip('/')}/health", timeout=5)
    if status != 200:
        raise UserInputError(f"{where} {url}: no MLflow server answers there (GET /health -> {status or 'no answer'});"
                             " start one (mlflow server) or fix the URL")
    return url.rstrip("/")


def register_version(registry: str, model_folder: Path, version: int | None = None, alias: str | None = None,
                     name: str | None = None) -> dict[str, Any]:
    """Register ``version`` (default: the latest) of the model in ``model_folder``; returns
    {"name", "version" (the registry's), "run_id", "source", "uri", "metrics", "config" (which config.pbtxt
    was attached), "note" (what to tell the user, or "")}. Checked before anything is sent: the version's
    files against metadata.yaml (as validate and ``publish --to s3`` check them), and the config it is
    registered with (_version_config). A Triton version already registered under ``name`` with the same
    files and config is not registered again (its registry version is returned, "already" True, and
    "note" says so); another build with the same number, or another config, is a new registry version."""

    folder = _model_folder(Path(model_folder))
    version = latest_version(folder) if version is None else version
    if version is None or not (folder / str(version)).is_dir() or version not in existing_versions(folder):
        have = ", ".join(map(str, existing_versions(folder))) or "none"
        asked = f" {version}" if version is not None else ""
        raise UserInputError(f"{folder}: no version{asked} to register (versions there: {have}); pass --version "
                             "with one of them, or build one first")
    name = name or folder.name
    version_dir = folder / str(version)
    _registry_given(registry)  # a missing or unsupported --registry is said first; asked only once all is checked
    local_version_files(version_dir, "register")  # a changed or renamed version is refused before anything is sent
    meta = read_metadata(version_dir / "metadata.yaml")
    config_path, config_said, config_note = _version_config(folder, version, meta)
    rest = _Rest(registry_url(registry))
    same = _already_registered(rest, name, version, version_dir, config_path)
    if same is not None:
        if alias:
            rest.call("POST", "api/2.0/mlflow/registered-models/alias",
                      {"name": name, "alias": alias, "version": same["version"]})
        note = (f"{folder.name} version {version} is already registered as models:/{name}/{same['version']} with "
                "the same files and config; nothing new registered"
                + (f" (alias {alias} now points at it)" if alias else ""))
        return {"name": name, "version": int(same["version"]), "run_id": same.get("run_id", ""),
                "source": same["source"], "uri": f"models:/{name}/{same['version']}", "metrics": _numbers(meta),
                "config": config_said, "note": note, "already": True}
    experiment = _experiment_id(rest)
    tags = {"triton_builder.model": folder.name, "triton_builder.version": str(version),
            "triton_builder.config": config_said,
            "host": json.dumps(meta.get("host") or {})[:TAG_LIMIT],
            "variants": json.dumps((meta.get("selection") or {}).get("candidates") or {})[:TAG_LIMIT],
            "variant": str((meta.get("artifact") or {}).get("variant", ""))}
    run = rest.call("POST", "api/2.0/mlflow/runs/create", {
        "experiment_id": experiment, "run_name": f"{folder.name}-v{version}", "start_time": int(time.time() * 1000),
        "tags": [{"key": k, "value": v} for k, v in tags.items()]})["run"]
    run_id, root = run["info"]["run_id"], _artifact_root(run)
    now = int(time.time() * 1000)
    metrics = _numbers(meta)
    rest.call("POST", "api/2.0/mlflow/runs/log-batch", {"run_id": run_id, "metrics": [
        {"key": k, "value": float(v), "timestamp": now, "step": 0} for k, v in metrics.items()]})
    files = [(f"model/{version}/{p.relative_to(version_dir)}", p) for p in sorted(version_dir.rglob("*"))
             if p.is_file() and "__pycache__" not in p.relative_to(version_dir).parts]
    files.append(("model/config.pbtxt", config_path))
    files += [(f"model/{relative}", folder / relative) for relative in referenced_files(config_path.read_text())]
    for relative, path in files:
        rest.call("PUT", f"api/2.0/mlflow-artifacts/artifacts/{root}/{urllib.parse.quote(relative)}",
                  path.read_bytes())
    rest.call("POST", "api/2.0/mlflow/runs/update", {"run_id": run_id, "status": "FINISHED",
                                                     "end_time": int(time.time() * 1000)})
    try:
        rest.call("POST", "api/2.0/mlflow/registered-models/create", {"name": name})
    except ServerError as err:
        if "RESOURCE_ALREADY_EXISTS" not in str(err):
            raise
    source = f"mlflow-artifacts:/{root}/model"
    created = rest.call("POST", "api/2.0/mlflow/model-versions/create", {
        "name": name, "source": source, "run_id": run_id,
        "tags": [{"key": "triton_builder.version", "value": str(version)},
                 {"key": "triton_builder.model", "value": folder.name}]})["model_version"]
    if alias:
        rest.call("POST", "api/2.0/mlflow/registered-models/alias",
                  {"name": name, "alias": alias, "version": created["version"]})
    return {"name": name, "version": int(created["version"]), "run_id": run_id, "source": source,
            "uri": f"models:/{name}/{created['version']}", "metrics": metrics, "config": config_said,
            "note": config_note, "already": False}


def _numbers(meta: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in _metrics(meta).items() if isinstance(v, (int, float))}


def _version_config(folder: Path, version: int, meta: dict[str, Any]) -> tuple[Path, str, str]:
    """The config.pbtxt to register ``version`` with: (path, which one it is, a note for the user or "").
    The model folder's config.pbtxt is the LATEST version's (each publish replaces it), so an older
    version is registered with its own signed copy where it has one; without one, with the current config
    only when that still describes its interface (said in the note and a tag), else refused: a registry
    version whose config does not fit its model fails validate and serve."""

    own = folder / str(version) / SIGNED_CONFIG
    if own.is_file():
        return own, f"{version}/{SIGNED_CONFIG} (the config published with version {version})", ""
    latest = latest_version(folder)
    current = folder / "config.pbtxt"
    mismatch = version_mismatch(meta, parse_config(current.read_text(), str(current)))
    if version == latest and mismatch:
        raise UserInputError(
            f"{current} does not describe version {version}'s interface ({'; '.join(mismatch)}; metadata.yaml's "
            "spec -> config.pbtxt): edited since the build, so the registry version would fail validate and serve; "
            "restore the config (rebuild, or `triton-builder tune --publish` for a tuned one)")
    if version == latest:
        return current, f"config.pbtxt (the config of version {version}, the latest)", ""
    if mismatch:
        raise UserInputError(
            f"{current} is version {latest}'s config and does not describe version {version}'s interface "
            f"({'; '.join(mismatch)}), and version {version} holds no copy of its own config (no {SIGNED_CONFIG}: "
            f"built unsigned): registered with it, models:/... would fail validate and serve; register version "
            f"{latest}, or build version {version}'s spec again (a new version) and register that")
    said = f"config.pbtxt of version {latest} (version {version} holds no config of its own)"
    return current, said, (f"version {version} is registered with the model's current config.pbtxt, version "
                           f"{latest}'s (version {version} was built unsigned and holds no copy of its own): it "
                           f"describes version {version}'s inputs and outputs, but its other settings (instances, "
                           f"batching) are version {latest}'s")


def _already_registered(rest: _Rest, name: str, version: int, version_dir: Path,
                        config: Path) -> dict[str, Any] | None:
    """The registry version of ``name`` that already holds Triton ``version`` with the same metadata.yaml
    (it pins every file's sha256) and the same config, or None. Only the content says "the same": another
    build numbered alike (a CI job building into a fresh repository always publishes version 1), or the
    version with a config tuned since, is a new registry version, as MLflow numbers them."""
    ours = {"metadata.yaml": (version_dir / "metadata.yaml").read_bytes(), "config.pbtxt": config.read_bytes()}
    token, holding = None, []
    while True:
        query = {"filter": f"name='{name}'", "max_results": 1000, **({"page_token": token} if token else {})}
        found = rest.call("GET", "api/2.0/mlflow/model-versions/search", query=query)
        holding += [r for r in found.get("model_versions", [])
                    if any(t.get("key") == "triton_builder.version" and t.get("value") == str(version)
                           for t in r.get("tags", []))]
        token = found.get("next_page_token")
        if not token:
            break
    for record in sorted(holding, key=lambda r: int(r["version"])):
        source = record.get("source", "")
        if not source.startswith("mlflow-artifacts:/"):
            continue
        prefix = source[len("mlflow-artifacts:/"):].lstrip("/")
        same = True
        for what, path in (("metadata.yaml", f"{prefix}/{version}/metadata.yaml"),
                           ("config.pbtxt", f"{prefix}/config.pbtxt")):
            try:
                theirs = rest.call("GET", f"api/2.0/mlflow-artifacts/artifacts/{urllib.parse.quote(path)}", raw=True)
            except ServerError:  # gone from the artifact store: not the same content
                theirs = None
            same = same and theirs == ours[what]
        if same:
            return record
    return None


def _model_folder(folder: Path) -> Path:
    """``folder`` when it holds a model (config.pbtxt); else an error naming it and what to pass instead
    (a repository given whole lists its models)."""
    folder = folder.resolve()
    if (folder / "config.pbtxt").is_file():
        return folder
    if not folder.is_dir():
        raise UserInputError(f"{folder}: no such model folder; pass <repository>/<model name>")
    models = sorted(p.name for p in folder.iterdir() if (p / "config.pbtxt").is_file())
    if models:
        raise UserInputError(f"{folder} is a model repository, not a model folder; pass <repository>/<model name>: "
                             + ", ".join(str(folder / m) for m in models))
    raise UserInputError(f"{folder}: not a model folder (no config.pbtxt); pass <repository>/<model name>")


def _experiment_id(rest: _Rest) -> str:
    try:
        found = rest.call("GET", "api/2.0/mlflow/experiments/get-by-name", query={"experiment_name": EXPERIMENT})
        return found["experiment"]["experiment_id"]
    except ServerError as err:
        if "RESOURCE_DOES_NOT_EXIST" not in str(err) and "HTTP 404" not in str(err):
            raise
    return rest.call("POST", "api/2.0/mlflow/experiments/create", {"name": EXPERIMENT})["experiment_id"]


def _metrics(meta: dict[str, Any]) -> dict[str, Any]:
    accuracy = meta.get("accuracy") or {}
    bench = meta.get("benchmark") or {}
    return {"accuracy": accuracy.get("variant"), "accuracy_reference": accuracy.get("reference"),
            "accuracy_drop": accuracy.get("drop"), "latency_p50_ms_b1": (bench.get("latency_ms_b1") or {}).get("p50"),
            "latency_p99_ms_b1": (bench.get("latency_ms_b1") or {}).get("p99"),
            "best_throughput": bench.get("best_throughput"), "peak_memory_mb": bench.get("peak_memory_mb")}


def parse_registry_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME/VERSION`` -> (NAME, VERSION, None); ``models:/NAME@ALIAS`` -> (NAME, None, ALIAS)."""
    body = uri[len("models:/"):] if uri.startswith("models:/") else ""
    if "@" in body and "/" not in body:
        name, alias = body.split("@", 1)
        if name and alias:
            return name, None, alias
    parts = body.split("/")
    if len(parts) == 2 and parts[0] and parts[1].isdigit():
        return parts[0], parts[1], None
    raise UserInputError(f"{uri}: not a registry URI; give models:/NAME/VERSION or models:/NAME@ALIAS")


def materialise(uri: str, registry: str | None = None, cache: Path | None = None) -> Path:
    """Download the registry version ``uri`` into ``cache``/NAME-vN/model_repository/NAME (config.pbtxt and
    the version folder) and return that model folder (a fresh download each time)."""
    if not (registry or os.environ.get(REGISTRY_ENV)):
        raise UserInputError(f"{uri}: which MLflow server? pass --registry URL or set ${REGISTRY_ENV}")
    name, number, alias = parse_registry_uri(uri)
    rest = _Rest(registry_url(registry))
    if alias:
        found = rest.call("GET", "api/2.0/mlflow/registered-models/alias", query={"name": name, "alias": alias})
    else:
        found = rest.call("GET", "api/2.0/mlflow/model-versions/get", query={"name": name, "version": number})
    record = found["model_version"]
    source = record["source"]
    if not source.startswith("mlflow-artifacts:/"):
        raise UserInputError(f"{uri}: its source {source} was not registered by triton-builder")
    root = Path(cache or Path(tempfile.gettempdir()) / "triton-builder-registry") / f"{name}-v{record['version']}"
    shutil.rmtree(root, ignore_errors=True)
    target = root / "model_repository" / name
    prefix = source[len("mlflow-artifacts:/"):].lstrip("/")
    _download(rest, prefix, prefix, target)
    if not (target / "config.pbtxt").is_file():
        raise UserInputError(f"{uri}: no config.pbtxt among its artifacts: not a triton-builder registration")
    return target


def _download(rest: _Rest, prefix: str, path: str, target: Path) -> None:
    listing = rest.call("GET", "api/2.0/mlflow-artifacts/artifacts", query={"path": path})
    for entry in listing.get("files", []):
        child = f"{path}/{entry['path'].rsplit('/', 1)[-1]}"
        local = target / child[len(prefix):].lstrip("/")
        if ".." in Path(local).relative_to(target).parts:
            raise ServerError(f"refusing artifact path {child}: it leaves the download folder")
        if entry.get("is_dir"):
            _download(rest, prefix, child, target)
        else:
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(rest.call("GET", f"api/2.0/mlflow-artifacts/artifacts/{urllib.parse.quote(child)}",
                                        raw=True))
