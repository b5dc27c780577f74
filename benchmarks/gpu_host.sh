#!/usr/bin/env bash
# The GPU checks, in one go on a lent GPU host (no network there: what the project needs beyond the host's own
# Python comes carried in .gpu_carry/, made on a networked machine by `bash benchmarks/gpu_carry.sh`).
#
#   bash benchmarks/gpu_host.sh [STEP ...]     steps: facts tests fp16 serve ort_gpu (default: all)
#
# Writes logs and results under $OUT (default /tmp/gpu-out). Every step runs even when an earlier one fails;
# the exit status is the number of failed steps.
set -u
OUT=${OUT:-/tmp/gpu-out}
SITE=${SITE:-/tmp/gpu-site}
CARRY=${CARRY:-.gpu_carry}
mkdir -p "$OUT" "$SITE"
steps=${*:-facts tests fp16 serve ort_gpu}
failed=0

setup() {
    [ -f "$SITE/.ready" ] && return 0
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$CARRY"/whl/*.whl || return 1
    tar -xJf "$CARRY/site.tar.xz" -C "$SITE" || return 1
    mkdir -p ~/.cache/triton-builder && tar -xJf "$CARRY/perf_analyzer.tar.xz" -C ~/.cache/triton-builder || return 1
    if [ -f "$CARRY/backends.tar.xz" ]; then  # Triton's C++ onnxruntime backend (CPU build), made by gpu_carry.sh
        tar -xJf "$CARRY/backends.tar.xz" -C ~/.cache/triton-builder || return 1
    fi
    if [ -f "$CARRY/backends_gpu.tar.xz" ]; then  # its GPU build, less onnxruntime-gpu's libraries (step_ort_gpu)
        tar -xJf "$CARRY/backends_gpu.tar.xz" -C ~/.cache/triton-builder || return 1
    fi
    touch "$SITE/.ready"
}
setup || { echo "setup failed: is .gpu_carry/ there (bash benchmarks/gpu_carry.sh)?"; exit 99; }
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
tb() { python3 -m builder "$@"; }

step_facts() {
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
    python3 -c "import sys, torch, numpy, onnxruntime; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0)); print('numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
    grep -m1 "model name" /proc/cpuinfo; nproc
    python3 -c "import json; from builder.core.host import host_profile; p = host_profile(); p.pop('isa_flags'); print(json.dumps(p))"
}

step_tests() {
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_gpu.py -rs 2>&1 | tee "$OUT/pytest_gpu.log"
    return "${PIPESTATUS[0]}"
}

step_fp16() {
    python3 benchmarks/gpu_fp16.py --results "$OUT/gpu_fp16.md"
}

# the python backend on a KIND_GPU instance (deploy.instance_kind gpu): TorchScript FP32 and FP16 on the GPU,
# checked against the reference over HTTP and gRPC, measured with perf_analyzer at concurrency 1 and 16
step_serve() {
    local rc=0 work=/tmp/gpu-serve
    rm -rf "$work"; mkdir -p "$work"
    for example in ${GPU_SERVE_EXAMPLES:-digits convnet64}; do
        cp -r "examples/$example" "$work/$example"
        printf 'deploy:\n  instance_kind: gpu\n' >> "$work/$example/spec.yaml"
        tb build "$work/$example/spec.yaml" --repository "$work/repo" --variants torchscript,torchscript_fp16 \
            --publish-variants --benchmark-seconds 2 2>&1 | tee "$OUT/build_$example.log" | tail -8 || rc=1
    done
    tb serve --repository "$work/repo" --http-port 18000 --grpc-port 18001 --metrics-port 18002 > "$OUT/serve.log" 2>&1 &
    local pid=$!
    for _ in $(seq 90); do curl -sf 127.0.0.1:18000/v2/health/ready >/dev/null && break; sleep 1; done
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    for model in $(ls "$work/repo"); do
        [ -f "$work/repo/$model/config.pbtxt" ] || continue
        grep -A2 instance_group "$work/repo/$model/config.pbtxt" | tr '\n' ' '; echo
        tb check "$model" --repository "$work/repo" --url 127.0.0.1:18000 --grpc-url 127.0.0.1:18001 || rc=1
        tb sweep "$model" --repository "$work/repo" --url 127.0.0.1:18001 --protocol grpc --engine perf_analyzer \
            --levels 1,16 --seconds-per-level 5 --out "/tmp/gpu-sweep/$model" 2>&1 | tail -6 || rc=1
    done
    curl -s 127.0.0.1:18002/metrics | grep -E "^nv_gpu_(utilization|memory_used)|^nv_inference_count" | head -20
    kill "$pid"; wait "$pid"
    grep -E "^  backend " "$OUT/serve.log"   # which backends were Triton's own C++ ones, which stand-ins
    tail -3 "$OUT/serve.log"
    return $rc
}

# Triton's onnxruntime backend built for the GPU (`install-backends --backend onnxruntime-gpu`, carried without
# onnxruntime-gpu's libraries: docs/benchmarks.md) serving a KIND_GPU ONNX folder with the CUDA execution provider,
# under TRITON_BUILDER_BACKENDS=gpu: checked over HTTP and gRPC, measured with perf_analyzer at concurrency 1 and 16.
# The onnxruntime libraries come from this host's onnxruntime where it has the CUDA provider (the backend's C API
# header is 1.19's, which every later 1.x library serves); CUDA's libraries from its nvidia-* packages (torch's).
# Without either it says SKIPPED and why, and does not count as failed.
step_ort_gpu() {
    local rc=0 work=/tmp/gpu-ort home capi core nv missing pid log
    home=$(ls -d ~/.cache/triton-builder/backends/onnxruntime-*-cuda* 2>/dev/null | head -1)
    if [ -z "$home" ]; then echo "SKIPPED: no GPU build carried (bash benchmarks/gpu_carry.sh makes it)"; return 0; fi
    if [ ! -e "$home/libonnxruntime_providers_cuda.so" ]; then
        capi=$(python3 -c "import pathlib, onnxruntime; print(pathlib.Path(onnxruntime.__file__).parent / 'capi')")
        core=$(cd "$capi" 2>/dev/null && ls libonnxruntime.so.1.* 2>/dev/null | head -1)
        if [ -z "$core" ] || [ ! -f "$capi/libonnxruntime_providers_cuda.so" ]; then
            echo "SKIPPED: onnxruntime-gpu's libraries are not carried (libonnxruntime_providers_cuda.so: 70 MiB under"
            echo "  xz) and this host's onnxruntime ($capi) has no CUDA provider: docs/benchmarks.md has the plan"
            return 0
        fi
        ln -sf "$capi/$core" "$home/$core" && ln -sf "$core" "$home/libonnxruntime.so.1" && \
            ln -sf "$core" "$home/libonnxruntime.so" && ln -sf "$capi/libonnxruntime_providers_shared.so" \
            "$capi/libonnxruntime_providers_cuda.so" "$home/" || return 1
        echo "onnxruntime libraries from this host: $capi/$core"
    fi
    nv=$(python3 -c "import glob, os, site
print(':'.join(sorted({os.path.dirname(p) for d in site.getsitepackages() for p in glob.glob(d + '/nvidia/*/lib/*.so*')})))")
    # (the folder too: the backend loads libcudart.so.12 from it before onnxruntime opens its CUDA provider)
    missing=$(LD_LIBRARY_PATH="$home${nv:+:$nv}" ldd "$home/libonnxruntime_providers_cuda.so" \
        "$home/libtriton_onnxruntime.so" | grep "not found" | grep -v "libtritonserver" | sort -u)
    if [ -n "$missing" ]; then
        echo "SKIPPED: the CUDA provider cannot load here (LD_LIBRARY_PATH=$nv):"; echo "$missing"; return 0
    fi
    rm -rf "$work"; mkdir -p "$work"; cp -r examples/digits "$work/digits"
    tb build "$work/digits/spec.yaml" --repository "$work/repo" --target gpu --variants onnx --triton-release 24.10 \
        --benchmark-seconds 2 2>&1 | tee "$OUT/build_ort_gpu.log" | tail -4 || rc=1
    grep -A2 instance_group "$work/repo/digits_cnn/config.pbtxt" | tr '\n' ' '; echo
    LD_LIBRARY_PATH="$nv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TRITON_BUILDER_BACKENDS=gpu tb serve \
        --repository "$work/repo" --http-port 18100 --grpc-port 18101 --metrics-port 18102 > "$OUT/serve_ort_gpu.log" 2>&1 &
    pid=$!
    for _ in $(seq 90); do
        curl -sf 127.0.0.1:18100/v2/health/ready >/dev/null && break
        kill -0 "$pid" 2>/dev/null || { tail -5 "$OUT/serve_ort_gpu.log"; return 1; }  # it stopped: why
        sleep 1
    done
    grep -E "^  (backend  onnxruntime|serving|FAILED)" "$OUT/serve_ort_gpu.log"
    log=$(sed -n 's/^  log *\([^ ]*\).*/\1/p' "$OUT/serve_ort_gpu.log" | head -1)
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    tb check digits_cnn --repository "$work/repo" --url 127.0.0.1:18100 --grpc-url 127.0.0.1:18101 || rc=1
    tb sweep digits_cnn --repository "$work/repo" --url 127.0.0.1:18101 --protocol grpc --engine perf_analyzer \
        --levels 1,16 --seconds-per-level 5 --out /tmp/gpu-sweep/ort_gpu 2>&1 | tail -6 || rc=1
    curl -s 127.0.0.1:18102/metrics | grep -E "^nv_gpu_(utilization|memory_used)|^nv_inference_count" | head -8
    [ -n "$log" ] && cp "$log" "$OUT/tritonserver_ort_gpu.log"
    kill "$pid"; wait "$pid"
    # the instance on the GPU, the backend's GPU build and the CUDA provider in Triton's own log
    grep -E "ModelInstanceInitialize: digits_cnn.*GPU device|libtriton_onnxruntime|CUDA" \
        "$OUT/tritonserver_ort_gpu.log" 2>/dev/null | head -8
    grep -q "ModelInstanceInitialize: digits_cnn.*(GPU device" "$OUT/tritonserver_ort_gpu.log" 2>/dev/null || rc=1
    return $rc
}

for step in $steps; do
    echo "=== $step ($(date +%T))"
    if ! "step_$step"; then
        echo "=== $step FAILED"
        failed=$((failed + 1))
    fi
done
echo "=== done: $failed failed step(s)"
exit "$failed"
