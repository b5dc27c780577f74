#!/usr/bin/env bash
# Upstream drift caught before users (issue 49; .ci/run runs it): the freshly built wheel installed WITHOUT the
# lock, as `pip install triton-builder[examples]` resolves today (only torch pinned to 2.13.0: any other torch
# spec downloads several GB of CUDA wheels here, and the README says to install the CPU build first), then:
#   - the resolved versions printed (onnx, onnxruntime, openvino, transformers, numpy, ...);
#   - digits built with its default variants: every FP32 variant must pass verification;
#   - a module-wrapped BERT-family encoder (transformers BertModel, random weights, offline) built WITHOUT
#     value_range, once without data and once with data.validation: every FP32 variant must pass.
# The locked suite (make test) stays as it is: this is the day's resolution, not the lock.
#
# Usage: scripts/unlocked-smoke.sh          (KEEP=1 keeps the temp folder)
# Needs: .venv (make setup) to build the wheel; PyPI.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_PY=${BUILD_PY:-$ROOT/.venv/bin/python}
BASE_PY=$("$BUILD_PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
WORK=$(mktemp -d "${TMPDIR:-/tmp}/triton-builder-unlocked.XXXXXX")
log() { printf 'unlocked-smoke: %s\n' "$*"; }
cleanup() { if [ -n "${KEEP:-}" ]; then log "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

mkdir -p "$WORK/src" "$WORK/dist" "$WORK/outside"
tar -C "$ROOT" --exclude=__pycache__ -cf - pyproject.toml README.md builder templates loadtest monitoring \
    | tar -xf - -C "$WORK/src"
"$BUILD_PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
wheel=$(ls "$WORK"/dist/triton_builder-*.whl)
"$BASE_PY" -m venv "$WORK/venv"
started=$(date +%s)
# (a machine's pip config may name local indexes that do not exist: pip warns once per package; not news here)
(cd "$WORK/outside" && "$WORK/venv/bin/python" -m pip install -q torch==2.13.0 \
    && "$WORK/venv/bin/python" -m pip install -q "$wheel[examples]") 2> >(grep -v "^WARNING: Location '" >&2)
log "fresh venv, the wheel without the lock: $(( $(date +%s) - started )) s"
"$WORK/venv/bin/python" -m pip list --format=freeze 2>/dev/null \
    | grep -iE '^(torch|onnx|onnxruntime|onnxscript|onnxslim|onnxoptimizer|openvino|nncf|transformers|tokenizers|numpy|protobuf|tritonclient|nvidia-pytriton)==' \
    | sed 's/^/unlocked-smoke: resolved /'

cd "$WORK/outside"
unset PYTHONPATH
export PATH="$WORK/venv/bin:$PATH" VIRTUAL_ENV="$WORK/venv" HF_HUB_OFFLINE=1
tar -C "$ROOT/examples" --exclude=__pycache__ -cf - digits | tar -xf - -C "$WORK/outside"
mkdir -p bert
cp "$ROOT/tests/bert_encoder_model.py" bert/bert_model.py  # the tiny BERT encoder the integration test builds too
python - <<'PY'
import numpy as np
import yaml

seq = {"shape": [-1], "min_shape": [1], "opt_shape": [8], "max_shape": [16]}
spec = {"name": "bert_enc", "source": {"module": "bert_model:build"}, "max_batch_size": 4,
        "inputs": [{"name": "input_ids", "dtype": "int64", **seq}, {"name": "attention_mask", "dtype": "int64", **seq}],
        "outputs": [{"name": "last_hidden_state"}]}
open("bert/spec.yaml", "w").write(yaml.safe_dump(spec, sort_keys=False))
rng = np.random.default_rng(0)
lengths = rng.integers(3, 16, size=24)
ids = np.zeros((24, 16), np.int64)
mask = np.zeros((24, 16), np.int64)
for row, n in enumerate(lengths):  # [CLS] words [SEP], then padding: what a tokenizer makes
    ids[row, :n] = np.r_[1, rng.integers(5, 100, size=n - 2), 2]
    mask[row, :n] = 1
np.savez("bert/validation.npz", input_ids=ids, attention_mask=mask)
open("bert/spec_data.yaml", "w").write(yaml.safe_dump({**spec, "data": {"validation": "validation.npz"}},
                                                        sort_keys=False))
PY

fp32_verdicts() {  # every FP32 variant of a build report passed verification, else the failures
    python - "$1" <<'PY'
import json, sys
from pathlib import Path
report = json.loads(next(Path(sys.argv[1]).rglob("build_report.json")).read_text())
rows = [v for v in report["variants"] if v.get("precision") == "fp32"]
failed = [f"{v['variant']}: {v['rejected']}" for v in rows if v.get("rejected")]  # "" once it passed
print("unlocked-smoke:", ", ".join(v["variant"] for v in rows), "->", "all passed" if not failed else "FAILED")
for line in failed:
    print("unlocked-smoke:   ", line.replace("\n", " ")[:400])
sys.exit(1 if failed or not rows else 0)
PY
}

rc=0
for spec in digits/spec.yaml bert/spec.yaml bert/spec_data.yaml; do
    repo="repo-$(echo "$spec" | tr '/.' '__')"
    started=$(date +%s)
    if ! triton-builder build "$spec" --repository "$repo" --benchmark-seconds 0 -q > "$repo.log" 2>&1; then
        log "build $spec FAILED ($(( $(date +%s) - started )) s):"; tail -20 "$repo.log"; rc=1; continue
    fi
    log "build $spec: $(( $(date +%s) - started )) s"
    fp32_verdicts "$repo" || rc=1
done
[ "$rc" -eq 0 ] && log "ok: every FP32 variant passed on today's resolution" || log "FAILED: see above"
exit "$rc"
