"""nginx in front of several Triton replicas: HTTP (``proxy_pass``) and gRPC (``grpc_pass``, HTTP/2).

Usage::

    with NginxBalancer(http_backends=["127.0.0.1:8000", "127.0.0.1:9000"],
                       grpc_backends=["127.0.0.1:8001", "127.0.0.1:9001"]) as lb:
        lb.http_url, lb.grpc_url          # "127.0.0.1:<port>" each: point tritonclient at these
        lb.access_log                     # one line per request: upstream address, status, time
        lb.take_out(1)                    # no new request to replica 1 (rolling update: while it is checked)
        lb.put_back()                     # every replica in rotation again
    # stopped here (SIGTERM to nginx's process group; also at interpreter exit); its temp folder
    # (config, logs) is removed unless keep_files=True

nginx comes from Debian (``apt-get install nginx``; ``scripts/install-system-deps.sh`` does it).
Both listeners bind 127.0.0.1 by default. The configuration (``render_config``):

- round robin over the replicas; a replica that refuses or drops a connection is marked down for
  ``fail_timeout`` seconds (passive health checks: nginx OSS has no active ones);
- a request whose replica fails before answering is retried once on another one
  (``proxy_next_upstream`` / ``grpc_next_upstream`` with ``non_idempotent``: inference requests have
  no side effects, so retrying a POST is safe) - this is what keeps a replica's death invisible to
  clients except for requests it had already started answering;
- keep-alive connections to the replicas (HTTP/1.1 upstream, ``Connection ""``), 64 MB bodies.

nginx gets SIGTERM if the thread that started it dies (``PR_SET_PDEATHSIG``): start it from a thread
that lives as long as it should (the main thread normally).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from builder.core.errors import ServerError, UserInputError
from builder.core.processes import LocalService, free_port, port_open, run_command

__all__ = ["NginxBalancer", "find_nginx", "render_config"]

INSTALL_HINT = "run scripts/install-system-deps.sh (apt-get install -y --no-install-recommends nginx)"
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}\Z")


def find_nginx(binary: str | os.PathLike | None = None) -> str:
    """The nginx executable: ``binary``, ``$NGINX_BINARY``, PATH, then /usr/sbin/nginx."""
    for candidate in (binary, os.environ.get("NGINX_BINARY"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ServerError(f"nginx is not installed (the local balancer needs it): {INSTALL_HINT}")


def _check_backends(kind: str, backends: Sequence[str]) -> list[str]:
    backends = [str(b).strip() for b in backends]
    if not backends:
        raise UserInputError(f"{kind}_backends: at least one replica address (HOST:PORT) is needed")
    for address in backends:
        if not _ADDRESS.match(address):
            raise UserInputError(f"{kind}_backends: {address!r} is not HOST:PORT")
    return backends


def render_config(workdir: Path, http_backends: Sequence[str], grpc_backends: Sequence[str], host: str,
                  http_port: int, grpc_port: int, fail_timeout_s: int = 5, worker_user: str | None = None) -> str:
    """The nginx.conf text (everything under ``workdir``: pid, logs, temp files).

    With several replicas, each request picks its upstream group by whether ``workdir/out/<i>``
    exists (``NginxBalancer.take_out``): ``triton_http`` (every replica) or ``triton_http_without_<i>``.
    A file checked per request, not a config reload: a reload closes clients' idle keep-alive
    connections, and a request sent on one at that moment fails."""
    def servers(backends: Sequence[str]) -> str:
        return "\n".join(f"        server {b} max_fails=1 fail_timeout={fail_timeout_s}s;" for b in backends)

    def quoted(path: Path) -> str:  # a temp dir with a space would split the directive's arguments
        return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'

    def upstreams(kind: str, backends: Sequence[str]) -> str:
        groups = [(f"triton_{kind}", backends)]
        if len(backends) > 1:
            groups += [(f"triton_{kind}_without_{i}", backends[:i] + backends[i + 1:]) for i in range(len(backends))]
        return "\n".join(f"    upstream {name} {{\n{servers(members)}\n        keepalive 32;\n    }}\n"
                         for name, members in groups)

    def pool(kind: str, backends: Sequence[str]) -> str:
        lines = [f"        set $pool triton_{kind};"]
        if len(backends) > 1:
            lines += [f"        if (-f {quoted(workdir / 'out' / str(i))}) {{ set $pool triton_{kind}_without_{i}; }}"
                      for i in range(len(backends))]
        return "\n".join(lines)

    temp = "\n".join(f"    {kind}_temp_path {quoted(workdir / 'temp' / kind)};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = f"user {worker_user};\n" if worker_user else ""
    tries = max(2, min(len(http_backends), len(grpc_backends)))
    return f"""# written by builder.scaleout.balancer
{user}daemon off;
master_process on;
worker_processes 1;
pid {quoted(workdir / 'nginx.pid')};
error_log {quoted(workdir / 'error.log')} warn;

events {{
    worker_connections 1024;
}}

http {{
    log_format upstream '$remote_addr [$time_local] "$request" $status upstream=$upstream_addr '
                        'upstream_status=$upstream_status request_time=$request_time';
    access_log {quoted(workdir / 'access.log')} upstream;
{temp}
    client_max_body_size 64m;
    sendfile on;
    tcp_nodelay on;

{upstreams("http", http_backends)}
{upstreams("grpc", grpc_backends)}
    server {{
        listen {host}:{http_port};
{pool("http", http_backends)}
        location / {{
            proxy_pass http://$pool;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 2s;
            proxy_read_timeout 120s;
            proxy_send_timeout 120s;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries {tries};
        }}
    }}

    server {{
        listen {host}:{grpc_port} http2;
{pool("grpc", grpc_backends)}
        location / {{
            grpc_pass grpc://$pool;
            grpc_connect_timeout 2s;
            grpc_read_timeout 120s;
            grpc_send_timeout 120s;
            grpc_next_upstream error timeout http_502 http_503 non_idempotent;
            grpc_next_upstream_tries {tries};
        }}
    }}
}}
"""


class NginxBalancer(LocalService):
    """An nginx process balancing HTTP and gRPC over ``*_backends``; a context manager, or start/stop."""

    label = "nginx"
    error = ServerError
    stop_timeout = 10.0
    poll_interval = 0.05
    leftover_grace = 0.0  # a worker left behind in nginx's process group gets SIGKILL at once

    def __init__(self, http_backends: Sequence[str], grpc_backends: Sequence[str], host: str = "127.0.0.1",
                 http_port: int | None = None, grpc_port: int | None = None, fail_timeout_s: int = 5,
                 binary: str | None = None, ready_timeout: float = 15.0, keep_files: bool = False):
        super().__init__(host, ready_timeout)
        self.http_backends = _check_backends("http", http_backends)
        self.grpc_backends = _check_backends("grpc", grpc_backends)
        self.fail_timeout_s = int(fail_timeout_s)
        self.binary = binary
        self.keep_files = keep_files  # keep the config and logs (workdir) after stop()
        if http_port is not None and http_port == grpc_port:
            raise UserInputError(f"--grpc-port {grpc_port}: the same as --http-port; give the balancer two ports")
        self._requested = (http_port, grpc_port)
        self._ports: tuple[int, int] | None = None
        self._binary: str | None = None
        self.workdir: Path | None = None

    # -- addresses ---------------------------------------------------------------------------

    def _ports_or_raise(self) -> tuple[int, int]:
        if self._ports is None:
            raise ServerError("the balancer was not started; call start() first")
        return self._ports

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self._ports_or_raise()[0]}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self._ports_or_raise()[1]}"

    @property
    def config_path(self) -> Path:
        return self.workdir / "nginx.conf"

    @property
    def access_log(self) -> Path:
        return self.workdir / "access.log"

    @property
    def error_log(self) -> Path:
        return self.workdir / "error.log"

    @property
    def log_path(self) -> Path | None:
        return self.workdir / "nginx.out" if self.workdir is not None else None

    def upstream_counts(self) -> dict[str, int]:
        """Requests per replica address so far, from the access log (retries count for each try)."""
        counts: dict[str, int] = {}
        try:
            text = self.access_log.read_text(errors="replace")
        except OSError:
            return counts
        for match in re.finditer(r"upstream=(\S+)", text):
            for address in match.group(1).split(","):
                address = address.strip(" :")
                if address and address != "-":
                    counts[address] = counts.get(address, 0) + 1
        return counts

    # -- lifecycle (LocalService hooks) ------------------------------------------------------

    def _prepare(self) -> None:
        binary = self._binary = find_nginx(self.binary)
        self.workdir = Path(tempfile.mkdtemp(prefix="triton-builder-nginx-"))
        # nginx started as root runs its workers as 'nobody': they must reach the temp folders
        self.workdir.chmod(0o755)
        (self.workdir / "temp").mkdir(mode=0o755)
        worker_user = None
        if os.geteuid() == 0:
            worker_user = "nobody nogroup" if _group_exists("nogroup") else "nobody"
        http_port, grpc_port = self._requested
        self._ports = (http_port or free_port(self.host), grpc_port or free_port(self.host))
        if self._ports[0] == self._ports[1]:
            self._ports = (self._ports[0], free_port(self.host))
        (self.workdir / "out").mkdir(mode=0o755)  # take_out's flags (the workers stat them)
        self.config_path.write_text(render_config(self.workdir, self.http_backends, self.grpc_backends, self.host,
                                                  *self._ports, fail_timeout_s=self.fail_timeout_s,
                                                  worker_user=worker_user))
        test = run_command([binary, "-t", "-q", "-e", str(self.error_log), "-p", str(self.workdir),
                            "-c", str(self.config_path)], timeout=30)
        if test.returncode != 0:
            raise ServerError(f"nginx rejected its configuration {self.config_path}: "
                              f"{(test.stderr or test.stdout).strip()}")

    def take_out(self, index: int) -> None:
        """No new request goes to replica ``index`` (into the backend lists) until ``put_back``: the next
        request already picks the others (a flag file nginx checks per request); one at a time."""
        count = min(len(self.http_backends), len(self.grpc_backends))
        if count < 2 or not 0 <= index < count:
            raise UserInputError(f"replica {index}: only one of {count} replicas behind nginx can be taken out "
                                 "of rotation, and not the only one")
        self.put_back()
        (self.workdir / "out" / str(index)).touch()

    def put_back(self) -> None:
        """Every replica in rotation again."""
        if self.workdir is not None:
            for flag in (self.workdir / "out").glob("*"):
                flag.unlink(missing_ok=True)

    def _command(self) -> list[str]:
        return [self._binary, "-e", str(self.error_log), "-p", str(self.workdir), "-c", str(self.config_path)]

    def _fixed_ports(self) -> list[tuple[str, int]]:
        return list(zip(("--http-port", "--grpc-port"), self._requested))

    def _ready(self) -> bool:
        # nginx writes its pid file only after binding every listener: with our pid in it, the open
        # ports are ours (a port answering alone may be another process's, nginx failing to bind it)
        try:
            written = (self.workdir / "nginx.pid").read_text().strip()
        except OSError:
            return False
        return written == str(self.pid) and all(port_open(self.host, port) for port in self._ports_or_raise())

    def _exit_error(self, code: int) -> Exception:
        return ServerError(f"nginx exited with code {code} while starting: {self.error_summary()}")

    def _timeout_error(self) -> Exception:
        return ServerError(f"nginx did not listen on {self.host}:{self._ports} within {self.ready_timeout:g} s: "
                           f"{self.error_summary()}")

    def error_summary(self) -> str:
        """The last lines of error.log and of its output, for messages."""
        parts = []
        for path in (self.error_log, self.log_path):
            try:
                parts += path.read_text(errors="replace").strip().splitlines()[-5:]
            except OSError:
                pass
        return " | ".join(parts) or "(no output)"

    def _cleanup(self) -> None:
        if self.workdir is not None and not self.keep_files:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _group_exists(name: str) -> bool:
    try:
        import grp

        grp.getgrnam(name)
        return True
    except (ImportError, KeyError):
        return False
