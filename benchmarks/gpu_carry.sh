#!/usr/bin/env bash
# Packs what benchmarks/gpu_host.sh needs on a GPU host that has no network (Python 3.12 with torch, numpy,
# onnx, onnxruntime): the embedded tritonserver (nvidia-pytriton's binary, python backend, the 3.12 stub and
# bundled libraries), tritonclient, perf_analyzer 2.51 and the cp312 wheels of python-rapidjson,
# tritonclient[http]'s geventhttpclient stack and numpy 1.26 (the python backend stub of nvidia-pytriton 0.7
# answers empty outputs under numpy 2, which the GPU hosts have). Under the 64 MiB a call may carry. Run from the repository root after `make setup` (and one `sweep`/`tune` that installed
# perf_analyzer). Result: .gpu_carry/ (~35 MB; git-ignored through .git/info/exclude).
set -euo pipefail
site=$(.venv/bin/python -c "import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parents[1])")
carry=.gpu_carry
mkdir -p "$carry/whl" .git/info
grep -qx '/.gpu_carry/' .git/info/exclude 2>/dev/null || echo '/.gpu_carry/' >> .git/info/exclude
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
(cd ~/.cache/triton-builder && tar -cJf "$OLDPWD/$carry/backends.tar.xz" backends/onnxruntime-*)
du -sh "$carry"
