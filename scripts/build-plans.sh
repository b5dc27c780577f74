#!/usr/bin/env bash
# Build the TensorRT plans triton-builder recorded (<model>/<version>/plan_recipe.json) on THIS GPU
# with THIS TensorRT, and publish each as model <name>__tensorrt_fp16 next to the ONNX model.
#
#   docker compose --profile plans run --rm build-plans            # the usual way (GPU host)
#   scripts/build-plans.sh [REPOSITORY] [--model NAME] [--force] [--dry-run] [--no-measure]
#
# Needs only bash, python3, trtexec and nvidia-smi (all in the pinned NGC Triton image, so a plan
# is built by the TensorRT that serves it). The work is done by builder/tensorrt/plan_build.py
# (standard library only); this script finds the tools and hands over. docs/guides/tensorrt.md.
# Exit codes: 0 built / up to date / nothing to do; 1 a plan failed; 2 no GPU, trtexec or repository.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# the folder that holds builder/: the checkout this script sits in, or where compose mounts it
src="${TRITON_BUILDER_SRC:-$(dirname "$here")}"
if [[ ! -f "$src/builder/tensorrt/plan_build.py" ]]; then
    echo "build-plans: error: builder/tensorrt/plan_build.py not found under $src; set TRITON_BUILDER_SRC to" \
         "the triton-builder checkout (docker-compose.yml mounts it at /opt/triton-builder)" >&2
    exit 2
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "build-plans: error: python3 not found" >&2
    exit 2
fi

# trtexec: $TRTEXEC, else PATH, else where the NGC images keep it
if [[ -z "${TRTEXEC:-}" ]]; then
    TRTEXEC="$(command -v trtexec || true)"
    [[ -n "$TRTEXEC" ]] || TRTEXEC=/usr/src/tensorrt/bin/trtexec
fi
export TRTEXEC

export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1  # the checkout may be mounted read-only
exec python3 -m builder.tensorrt.plan_build "$@"
