#!/usr/bin/env bash
# The wheel works away from the checkout, as a user installs it (`make wheel-smoke`; .ci/run runs it):
#   1. build the wheel from a copy of the sources (a stale build/ in the checkout cannot leak in)
#   2. install it with the lock (requirements/constraints.txt) into a fresh venv in a temp folder,
#      no extras, and time that
#   3. from a temp folder, check that `builder` and its assets come from that venv, never the checkout
#   4. on a COPY of examples/digits: build, serve (embedded Triton), check over HTTP and gRPC, a
#      3 s load test, stop; render the k8s manifests from package data, and check that validating
#      them without the k8s extra names the extra to install
#
# Usage: scripts/wheel-smoke.sh          (KEEP=1 keeps the temp folder and prints where it is)
# Needs: .venv (make setup) to build the wheel, PyPI or a local index for setuptools.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_PY=${BUILD_PY:-$ROOT/.venv/bin/python}
# the fresh venv gets the interpreter the project's .venv was made from
BASE_PY=$("$BUILD_PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
WORK=$(mktemp -d "${TMPDIR:-/tmp}/triton-builder-wheel-smoke.XXXXXX")
serve_pid=""

log() { printf 'wheel-smoke: %s\n' "$*"; }
fail() { log "FAILED: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
cleanup() {
    if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
        kill -TERM "$serve_pid" 2>/dev/null || true
        wait "$serve_pid" 2>/dev/null || true
    fi
    if [ -n "${KEEP:-}" ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
started=$(now)

# 1. the wheel. What the build reads: keep this list in step with pyproject.toml.
mkdir -p "$WORK/src" "$WORK/dist" "$WORK/outside"
tar -C "$ROOT" --exclude=__pycache__ -cf - pyproject.toml README.md builder templates loadtest monitoring \
    | tar -xf - -C "$WORK/src"
t=$(now)
"$BUILD_PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
wheel=$(ls "$WORK"/dist/triton_builder-*.whl)
log "built $(basename "$wheel") in $(since "$t") s"

# 2. a fresh venv outside the checkout, the wheel and the lock
t=$(now)
"$BASE_PY" -m venv "$WORK/venv"
(cd "$WORK/outside" && "$WORK/venv/bin/python" -m pip install -q -c "$ROOT/requirements/constraints.txt" "$wheel")
log "fresh venv + install ($("$WORK/venv/bin/python" -V)): $(since "$t") s"

# 3. everything from the venv, nothing from the checkout
cd "$WORK/outside"
unset PYTHONPATH
export PATH="$WORK/venv/bin:$PATH" VIRTUAL_ENV="$WORK/venv"
where=$(python -c 'import builder, builder.core.assets as a; print(builder.__file__); print(a.templates_dir()); print(a.loadtest_dir())')
while read -r path; do
    case "$path" in
        "$WORK/venv/"*) ;;
        *) fail "$path is not inside the fresh venv $WORK/venv" ;;
    esac
done <<< "$where"
log "builder and its assets come from the venv: $(head -1 <<< "$where")"
python -m builder._assets.monitoring.exporter --help >/dev/null || fail "the exporter module is not in the wheel"

# 4. the digits example, copied away from the checkout
tar -C "$ROOT/examples" --exclude=__pycache__ -cf - digits | tar -xf - -C "$WORK/outside"
t=$(now)
triton-builder build digits/spec.yaml --repository repo --benchmark-seconds 1
log "build: $(since "$t") s"
# the runtime gate for docker-compose.yml's Triton release (its onnxruntime, in a cached side venv)
t=$(now)
release=$(python -c 'from builder.repository.triton_releases import COMPOSE_RELEASE; print(COMPOSE_RELEASE)')
triton-builder validate repo/digits_cnn --triton-release "$release" || fail "validate --triton-release $release"
log "validate --triton-release $release: $(since "$t") s"

# free ports (serve defaults to Triton's 8000-8002, which another process may hold)
read -r p_http p_grpc p_metrics < <(python -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
triton-builder serve --repository repo --http-port "$p_http" --grpc-port "$p_grpc" --metrics-port "$p_metrics" \
    </dev/null >serve.log 2>&1 &
serve_pid=$!
for _ in $(seq 1 240); do
    grep -q "is ready" serve.log && break
    kill -0 "$serve_pid" 2>/dev/null || { cat serve.log; fail "serve exited before it was ready"; }
    sleep 0.5
done
grep -q "is ready" serve.log || { cat serve.log; fail "serve was not ready within 120 s"; }
http=$(sed -n 's/^ *HTTP *\([0-9.]*:[0-9]*\).*/\1/p' serve.log | head -1)
grpc=$(sed -n 's/^ *gRPC *\([0-9.]*:[0-9]*\).*/\1/p' serve.log | head -1)
log "serving on HTTP $http, gRPC $grpc"
triton-builder check digits_cnn --repository repo --url "$http" --grpc-url "$grpc"
triton-builder loadtest digits_cnn --repository repo --url "$http" --users 2 --run-time 3 --out loadtest
kill -TERM "$serve_pid"
wait "$serve_pid" || fail "serve did not stop cleanly on SIGTERM"
serve_pid=""

triton-builder k8s --repository-url s3://models/digits --out k8s --model digits_cnn --no-validate >/dev/null
[ -s k8s/base/kustomization.yaml ] || fail "k8s rendered no kustomization.yaml"
set +e
message=$(triton-builder k8s --repository-url s3://models/digits --out k8s 2>&1)
code=$?
set -e
[ "$code" -eq 2 ] && grep -q "pip install 'triton-builder\[k8s\]'" <<< "$message" \
    || fail "k8s without the k8s extra: exit $code, expected 2 naming the extra: $message"

log "OK in $(since "$started") s: wheel built, installed outside the checkout, digits built, served, checked, load-tested"
