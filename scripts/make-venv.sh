#!/usr/bin/env bash
# Create triton-builder's virtualenv with a Python 3.10-3.12 (what `make setup` runs first).
#
#   - PYTHON (default python3) is used when it is 3.10-3.12; otherwise the first of python3.12,
#     python3.11, python3.10 on PATH; otherwise it stops and says what to install.
#   - Debian and Ubuntu split ensurepip (what `python -m venv` needs to put pip in the venv) out of
#     the interpreter into python3.X-venv: when it is missing, that package (else python3-venv) is
#     installed with apt-get, as root or through sudo, like scripts/install-system-deps.sh does.
#   - 3.13 and newer are refused (requires-python <3.13: nvidia-pytriton 0.7 needs numpy<2, which has no
#     3.13 wheels).
#   - TORCH_INDEX_URL (optional, e.g. https://download.pytorch.org/whl/cpu, PyTorch's CPU index): the
#     lock's torch is installed from there into the new venv (--no-deps; the lock install that follows
#     adds its dependencies and keeps it: torch==2.13.0 matches 2.13.0+cpu). Without it, torch 2.13.0
#     comes from PyPI, which for Linux x86_64 is the CUDA build with its nvidia-* wheels (about 2.7 GB),
#     unless a CPU wheel is found locally (CI's machine has one for Python 3.11 only).
#
# Usage: scripts/make-venv.sh [PYTHON] [VENV_DIR]        (defaults: python3 .venv)
set -euo pipefail

log() { printf 'make-venv: %s\n' "$*"; }
minor_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
supported() { case "$1" in 3.10|3.11|3.12) return 0 ;; *) return 1 ;; esac; }

requested=${1:-python3}
venv=${2:-.venv}

python=""
for candidate in "$requested" python3.12 python3.11 python3.10; do
    if command -v "$candidate" >/dev/null 2>&1 && supported "$(minor_of "$candidate")"; then
        python=$candidate
        break
    fi
done
if [ -z "$python" ]; then
    log "no Python 3.10-3.12 found (${requested} is $(minor_of "$requested" || echo 'not runnable'))." >&2
    log "install one (Debian/Ubuntu: apt-get install python3.11 python3.11-venv) and run: make setup PYTHON=python3.11" >&2
    exit 2
fi
version=$(minor_of "$python")
[ "$python" = "$requested" ] || log "$requested is not 3.10-3.12: using $python ($version)"

apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        log "apt-get not found: install Python $version's venv/ensurepip support by hand" >&2
        return 2
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            log "not root and no sudo: run as root: apt-get install -y $*" >&2
            return 3
        fi
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    # a fresh machine may have empty package lists: update once if the first attempt fails
    ${sudo[@]+"${sudo[@]}"} apt-get install -y --no-install-recommends "$@" \
        || { ${sudo[@]+"${sudo[@]}"} apt-get update && ${sudo[@]+"${sudo[@]}"} apt-get install -y --no-install-recommends "$@"; }
}

if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    log "$python ($version) has no ensurepip/venv: installing python${version}-venv"
    if ! apt_install "python${version}-venv"; then
        log "python${version}-venv did not install: trying python3-venv"
        apt_install python3-venv
    fi
    # a venv made before without pip is half made: start again
    if [ -d "$venv" ] && [ ! -x "$venv/bin/pip" ]; then
        rm -rf "$venv"
    fi
fi

"$python" -m venv "$venv"
log "$venv: Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())') ($python)"

if [ -n "${TORCH_INDEX_URL:-}" ]; then
    lock="$(dirname "$0")/../requirements/constraints.txt"
    torch_pin=$(sed -n 's/^\(torch==[^;[:space:]]*\).*/\1/p' "$lock" | head -n 1)
    if [ -z "$torch_pin" ]; then
        log "no torch== line in $lock" >&2
        exit 2
    fi
    log "installing $torch_pin from $TORCH_INDEX_URL (TORCH_INDEX_URL; its dependencies come with the lock)"
    "$venv/bin/python" -m pip install -q --no-deps --index-url "$TORCH_INDEX_URL" "$torch_pin"
fi
