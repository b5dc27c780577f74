#!/usr/bin/env bash
# Packs what benchmarks/gpu_host.sh needs on a GPU host that has no network (Python 3.12 with torch, numpy,
# onnx, onnxruntime): the embedded tritonserver (nvidia-pytriton's binary, python backend, the 3.12 stub and
# bundled libraries), tritonclient, perf_analyzer 2.51 and the cp312 wheels of python-rapidjson,
# tritonclient[http]'s geventhttpclient stack and numpy 1.26 (the python backend stub of nvidia-pytriton 0.7
# answers empty outputs under numpy 2, which the GPU hosts have), Triton's C++ onnxruntime backend (CPU build) and
# the library of its GPU build. Under the 64 MiB a call may carry (checked at the end). Run from the repository root
# after `make setup` (and one `sweep`/`tune` that installed perf_analyzer). Result: .gpu_carry/ (~61 MB; git-ignored
# through the repository's info/exclude).
#   MEASURE_ORT_GPU=1 bash benchmarks/gpu_carry.sh   also prints each GPU-build file's size under xz (minutes)
set -euo pipefail
site=$(.venv/bin/python -c "import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parents[1])")
carry=.gpu_carry
exclude=$(git rev-parse --git-path info/exclude)  # .git/info/exclude; a worktree's is its main repository's
mkdir -p "$carry/whl" "$(dirname "$exclude")"
grep -qx '/.gpu_carry/' "$exclude" 2>/dev/null || echo '/.gpu_carry/' >> "$exclude"
pin() { grep -E "^$1==" requirements/constraints.txt | head -1 | cut -d' ' -f1 | tr -d ';'; }
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$carry/whl" "$(pin python-rapidjson)" \
    "$(pin numpy)" "$(pin geventhttpclient)" "$(pin gevent)" "$(pin greenlet)" \
    "$(pin zope.event)" "$(pin zope.interface)" "$(pin brotli)"
(cd "$site" && tar -cJf "$OLDPWD/$carry/site.tar.xz" --exclude=__pycache__ --exclude='libpython3-*' \
    --exclude='python_backend_stubs/3.[0-9]' --exclude='python_backend_stubs/3.1[013]' \
    pytriton/__init__.py pytriton/tritonserver nvidia_pytriton.libs tritonclient)
tar -cJf "$carry/perf_analyzer.tar.xz" -C ~/.cache/triton-builder perf_analyzer
# Triton's own C++ onnxruntime backend (`triton-builder install-backends`, CPU build against onnxruntime 1.19.2):
# the GPU host's embedded server then serves onnxruntime_onnx folders through it, as it does here
# (onnxruntime only: the pytorch backend is keyed by the torch it links, which the GPU host's is not)
.venv/bin/triton-builder install-backends -q --backend onnxruntime
(cd ~/.cache/triton-builder && tar -cJf "$OLDPWD/$carry/backends.tar.xz" backends/onnxruntime-*-cpu-*)
# Its GPU build (`install-backends --backend onnxruntime-gpu`: TRITON_ENABLE_GPU=ON against onnxruntime-gpu 1.19.2,
# CUDA 12.6's libcudart), without onnxruntime-gpu's own libraries: libonnxruntime_providers_cuda.so alone is 70 MiB
# under xz, more than a call carries (docs/benchmarks.md, "Triton's onnxruntime backend on a GPU"). What is carried
# (~0.4 MB): the backend library, libcudart.so.12 and the record; gpu_host.sh's ort_gpu step puts the GPU host's
# onnxruntime libraries (where it has the CUDA provider) in the place of those left out.
.venv/bin/triton-builder install-backends -q --backend onnxruntime-gpu
(cd ~/.cache/triton-builder && tar -cJf "$OLDPWD/$carry/backends_gpu.tar.xz" --exclude='libonnxruntime*' \
    backends/onnxruntime-*-cuda*)
if [ -n "${MEASURE_ORT_GPU:-}" ]; then  # what carrying the whole GPU build would take, file by file (xz -6)
    for f in ~/.cache/triton-builder/backends/onnxruntime-*-cuda*/lib*; do
        [ -L "$f" ] || printf '%12d bytes under xz (%d raw)  %s\n' "$(xz -T0 -6 -c "$f" | wc -c)" "$(stat -c %s "$f")" \
            "$(basename "$f")"
    done
fi
du -sh "$carry"
total=$(du -sb "$carry" | cut -f1)
[ "$total" -le $((64 * 1024 * 1024)) ] || { echo "$carry is $total bytes: over the 64 MiB a call carries"; exit 1; }
