"""`serve --public-key --require-signature` on the real embedded tritonserver: a signed repository is
verified and served; the refusals (tampered, unsigned) are in tests/unit/test_signing.py."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import EXAMPLES, ROOT, require

pytestmark = pytest.mark.integration

require("model_signing", "signing")
require("OpenSSL", "signing")


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_a_signed_repository_is_verified_and_served(tmp_path):
    from builder.pipeline import build
    from tests.conftest import ec_key_pair

    private, public = ec_key_pair(tmp_path, "k")
    repo = tmp_path / "model_repository"
    build(EXAMPLES / "digits/spec.yaml", repo, variants=["onnx"], benchmark_seconds=0, signing_key=private)
    http, grpc, metrics = _free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--repository", str(repo), "--public-key",
                             str(public), "--require-signature", "--http-port", str(http), "--grpc-port", str(grpc),
                             "--metrics-port", str(metrics)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline, seen = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "is ready" in line:
                break
        assert any("is ready" in line for line in seen), "".join(seen)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(seen) + out
