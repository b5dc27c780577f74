"""Run a real local Alertmanager (Debian's ``prometheus-alertmanager``) routing alerts to a webhook.

The configuration is derived from ``monitoring/alertmanager/alertmanager.yml`` (what docker compose
mounts), with the webhook receivers' URL replaced, so what runs here routes as the deployment does.

Usage::

    from builder.monitoring.alertmanager import LocalAlertmanager
    from builder.monitoring.prometheus import LocalPrometheus

    with LocalAlertmanager(webhook_url="http://127.0.0.1:5001/alerts", group_wait="1s") as am, \\
         LocalPrometheus({"triton": "127.0.0.1:8002"}, alertmanager_url=am.url) as prom:
        print(am.url)          # http://127.0.0.1:<free port>; prom sends its firing alerts there
        am.alerts()            # /api/v2/alerts: what Alertmanager holds now

    check_config("monitoring/alertmanager/alertmanager.yml")   # [] when amtool accepts it

Details:

- Binds 127.0.0.1 on a free port (or ``port``); clustering is off (``--cluster.listen-address=``,
  otherwise Alertmanager listens on 0.0.0.0:9094); notification state lives in a temp dir, removed
  on ``stop()`` unless ``keep_data``.
- ``webhook_url`` replaces the ``url`` of every ``webhook_configs`` entry; None keeps the file's.
  ``group_wait`` / ``group_interval`` / ``repeat_interval`` override the root route and its children
  (tests want seconds, not the shipped 10s / 1m / 4h).
- A missing binary is a ``ServerError`` telling to run ``scripts/install-system-deps.sh``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from builder.core import assets
from builder.core.errors import ServerError, UserInputError
from builder.core.processes import http_get as _http, run_command
from builder.monitoring.configured_service import ConfiguredService, find_binary

__all__ = ["DEFAULT_CONFIG", "INSTALL_HINT", "find_alertmanager", "render_config", "check_config",
           "LocalAlertmanager"]

#: The configuration docker compose mounts and ``LocalAlertmanager`` derives its own from.
DEFAULT_CONFIG = assets.monitoring_dir() / "alertmanager" / "alertmanager.yml"
INSTALL_HINT = ("run scripts/install-system-deps.sh (or `make setup`): it installs Debian's "
                "`prometheus-alertmanager` package")
_BINARIES = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's name


def find_alertmanager(binary: str | os.PathLike | None = None) -> str:
    """Path of the Alertmanager binary (``binary``, else ``$ALERTMANAGER_BINARY``, else PATH)."""
    return find_binary("alertmanager", "ALERTMANAGER_BINARY", _BINARIES, binary, INSTALL_HINT)


def _webhook_configs(config: dict) -> list[dict]:
    return [w for r in config.get("receivers") or [] for w in r.get("webhook_configs") or []]


def render_config(template: Path | str = DEFAULT_CONFIG, webhook_url: str | None = None,
                  group_wait: str | None = None, group_interval: str | None = None,
                  repeat_interval: str | None = None) -> dict[str, Any]:
    """The configuration ``LocalAlertmanager`` writes, as a dict (see the module doc)."""
    template = Path(template)
    try:
        config = yaml.safe_load(template.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise UserInputError(f"cannot read the Alertmanager config {template}: {err}") from None
    if webhook_url is not None:
        if not str(webhook_url).startswith(("http://", "https://")):
            raise UserInputError(f"webhook_url {webhook_url!r}: must be an http:// or https:// URL")
        hooks = _webhook_configs(config)
        if not hooks:
            raise UserInputError(f"{template} has no receiver with webhook_configs to point at {webhook_url}; "
                                 "add one (see monitoring/alertmanager/alertmanager.yml)")
        for hook in hooks:
            hook["url"] = str(webhook_url)
    timings = {"group_wait": group_wait, "group_interval": group_interval, "repeat_interval": repeat_interval}
    routes = [config.setdefault("route", {})]
    while routes:
        route = routes.pop()
        for key, value in timings.items():
            if value is not None and (key in route or route is config["route"]):
                route[key] = value
        routes.extend(route.get("routes") or [])
    return config


def check_config(path: Path | str = DEFAULT_CONFIG, timeout: float = 60) -> list[str]:
    """``amtool check-config`` on ``path``: [] when it passes, else its complaint (one entry)."""
    amtool = shutil.which("amtool")
    if amtool is None:
        raise ServerError(f"amtool is not installed; {INSTALL_HINT}")
    done = run_command([amtool, "check-config", str(path)], timeout=timeout)
    if done.returncode == 0:
        return []
    return [f"{path}: {' '.join((done.stdout + done.stderr).split())}"]


class LocalAlertmanager(ConfiguredService):
    """A real Alertmanager process; a context manager, or start/stop.

    Arguments:
        webhook_url: where every webhook receiver sends (None: the file's URL).
        group_wait, group_interval, repeat_interval: route timings ("1s", "10s", ...); None: the file's.
        port: the port to listen on; None picks a free one. host: the listen address (127.0.0.1).
        config_template: the configuration to derive from (default monitoring/alertmanager/alertmanager.yml).
        binary: the executable (default: ``$ALERTMANAGER_BINARY``, ``prometheus-alertmanager`` or
            ``alertmanager`` on PATH).
        keep_data: keep the temp dir (config, state, log) after ``stop()``.
    """

    label = "alertmanager"
    config_name = "alertmanager.yml"

    def __init__(self, webhook_url: str | None = None, *, group_wait: str | None = None,
                 group_interval: str | None = None, repeat_interval: str | None = None, port: int | None = None,
                 host: str = "127.0.0.1", config_template: Path | str = DEFAULT_CONFIG,
                 binary: str | os.PathLike | None = None, ready_timeout: float = 30.0, keep_data: bool = False):
        if ready_timeout <= 0:
            raise UserInputError(f"ready_timeout must be positive, got {ready_timeout}")
        super().__init__(host, ready_timeout, port, keep_data)
        self.webhook_url = webhook_url
        self.timings = dict(group_wait=group_wait, group_interval=group_interval, repeat_interval=repeat_interval)
        self.config_template = Path(config_template)
        self.binary = binary
        self.config: dict[str, Any] | None = None

    def _prepare(self) -> None:
        self._binary = find_alertmanager(self.binary)
        self.config = render_config(self.config_template, self.webhook_url, **self.timings)
        self._make_workdir()
        self.config_path.write_text("# written by builder.monitoring.alertmanager from " + str(self.config_template)
                                    + "\n" + yaml.safe_dump(self.config, sort_keys=False))

    def _command(self) -> list[str]:
        data = self.workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        return [self._binary, f"--config.file={self.config_path}", f"--storage.path={data}",
                f"--web.listen-address={self.host}:{self._port}", "--cluster.listen-address=",
                "--log.level=info"]

    def _config_note(self) -> str:
        return f"config: {self.config_path} (from {self.config_template})"

    # -- state -------------------------------------------------------------------------------

    def alerts(self) -> list[dict]:
        """The alerts Alertmanager holds (``/api/v2/alerts``), each with ``labels`` and ``status``."""
        status, body = _http(self.url + "/api/v2/alerts")
        if status != 200:
            raise ServerError(f"alertmanager {self.url}/api/v2/alerts answered {status}: {body[:200]!r}")
        return json.loads(body.decode("utf-8"))
