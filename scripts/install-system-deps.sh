#!/usr/bin/env bash
# Install the system packages triton-builder's monitoring tests need:
#   - prometheus      (Debian package: provides /usr/bin/prometheus and /usr/bin/promtool)
#   - docker-compose  (Debian package, v1: validates docker-compose.yml without an engine)
#   - nginx           (Debian package: the local balancer in front of Triton replicas, HTTP + gRPC)
#   - prometheus-alertmanager (Debian package: /usr/bin/prometheus-alertmanager and amtool; the
#                     alerting test routes a real alert to a local webhook)
#   - cmake, ninja-build, g++, patchelf, rapidjson-dev, googletest: `triton-builder install-backends` builds
#                     Triton's own C++ backends (r24.10 sources) for the embedded server with them
#
# Idempotent: packages whose command is already on PATH are left alone and the
# script exits 0.  Installs with `apt-get install -y --no-install-recommends`;
# runs `apt-get update` only if the first install attempt fails (stale or empty
# package lists).  Runs as root (CI does); otherwise uses sudo when available;
# otherwise explains what to run and exits non-zero.
#
# Usage: scripts/install-system-deps.sh
set -euo pipefail

log() { printf 'install-system-deps: %s\n' "$*"; }

# command-on-PATH -> Debian package
# (an absolute path: a file the package installs, for packages of headers or sources)
declare -a WANT_CMDS=(promtool prometheus docker-compose nginx prometheus-alertmanager amtool cmake ninja g++ patchelf
                      /usr/include/rapidjson/document.h /usr/src/googletest/CMakeLists.txt)
declare -A PKG_OF=([promtool]=prometheus [prometheus]=prometheus [docker-compose]=docker-compose [nginx]=nginx
                   [prometheus-alertmanager]=prometheus-alertmanager [amtool]=prometheus-alertmanager
                   [cmake]=cmake [ninja]=ninja-build [g++]=g++ [patchelf]=patchelf
                   [/usr/include/rapidjson/document.h]=rapidjson-dev [/usr/src/googletest/CMakeLists.txt]=googletest)

# on PATH, or in an sbin folder a non-root PATH may leave out (nginx lives in /usr/sbin); a path: that file
have() {
    case "$1" in /*) [ -f "$1" ]; return ;; esac
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]
}
where() {
    case "$1" in /*) echo "$1"; return ;; esac
    command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || echo "/sbin/$1"
}

missing_pkgs=()
for cmd in "${WANT_CMDS[@]}"; do
    pkg="${PKG_OF[$cmd]}"
    if have "$cmd"; then
        log "$cmd already present at $(where "$cmd")"
    else
        log "$cmd missing (package: $pkg)"
        case " ${missing_pkgs[*]-} " in
            *" $pkg "*) ;;
            *) missing_pkgs+=("$pkg") ;;
        esac
    fi
done

if [ "${#missing_pkgs[@]}" -eq 0 ]; then
    log "nothing to do"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: this script supports Debian/Ubuntu only." >&2
    log "install these packages by hand: ${missing_pkgs[*]}" >&2
    exit 2
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
        log "not root: using sudo"
    else
        log "not root and sudo is not available." >&2
        log "run as root: apt-get install -y --no-install-recommends ${missing_pkgs[*]}" >&2
        exit 3
    fi
fi

export DEBIAN_FRONTEND=noninteractive
install_cmd=(${SUDO[@]+"${SUDO[@]}"} apt-get install -y --no-install-recommends "${missing_pkgs[@]}")

log "installing: ${missing_pkgs[*]}"
if ! "${install_cmd[@]}"; then
    log "install failed; running apt-get update and retrying"
    ${SUDO[@]+"${SUDO[@]}"} apt-get update
    "${install_cmd[@]}"
fi

# triton-builder starts nginx itself (127.0.0.1, temp config); the distribution's service, which a
# fresh install may start on port 80 of every interface, is stopped and disabled.
case " ${missing_pkgs[*]} " in
    *" nginx "*)
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
            log "stopping and disabling the nginx system service (triton-builder runs its own instances)"
            ${SUDO[@]+"${SUDO[@]}"} systemctl disable --now nginx || true
        fi
        ;;
esac

# Verify.
rc=0
for cmd in "${WANT_CMDS[@]}"; do
    if have "$cmd"; then
        log "ok: $cmd -> $(where "$cmd")"
    else
        log "still missing after install: $cmd" >&2
        rc=1
    fi
done
if [ "$rc" -eq 0 ]; then
    log "installed: ${missing_pkgs[*]}"
fi
exit "$rc"
