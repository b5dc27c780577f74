# Everything a fresh machine needs is installed by these targets.
#   make test   - install (venv + system packages) and run the whole test suite
#   make test-fast - the unit tests that build no model and start no server (the inner loop, ~2 min)
#   make demo   - the main job: build the digits example, serve it on the embedded Triton,
#                 check it over HTTP and gRPC, load-test it, print the report, stop
# PYTHON: a Python 3.10-3.12 (scripts/make-venv.sh picks python3.12/3.11/3.10 when python3 is not one)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup system-deps perf-analyzer backends test test-unit test-fast demo demo-hf docs wheel-smoke unlocked-smoke bench bench-tuning bench-serving bench-drift bench-replicas bench-faults bench-zoo bench-compression bench-peers bench-anchors bench-anchors-avx2 bench-vs-ma bench-releases bench-standin bench-native bench-text-batching bench-monitor bench-rollouts bench-soak bench-hf clean

$(STAMP): pyproject.toml requirements/constraints.txt
	bash scripts/make-venv.sh "$(PYTHON)" $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP) system-deps perf-analyzer backends

system-deps:
	bash scripts/install-system-deps.sh

# Triton's own C++ backends (onnxruntime, r24.10) for the embedded server, built once into ~/.cache/triton-builder:
# the sources from $(TRITON_SOURCES_DIR) (../shared/third_party on these machines), else GitHub. A backend that
# cannot be built leaves its Python stand-in serving: setup goes on, and says so
export TRITON_SOURCES_DIR ?= $(wildcard $(abspath ../shared/third_party))
backends: $(STAMP) system-deps
	$(BIN)/triton-builder install-backends || echo "setup: Triton's C++ backends not built (see above): the embedded server serves through its Python stand-ins"

# Triton's perf_analyzer 2.51 (the binary only, into ~/.cache/triton-builder): sweep/tune measure with it
perf-analyzer: $(STAMP)
	bash scripts/install-perf-analyzer.sh $(VENV)

test: setup
	$(BIN)/python -m pytest -q --durations=25 $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

# the inner loop: the unit tests that build no model and start no server (tests marked `slow` left out: marked
# in their modules, or by tests/conftest.py for the fixtures they use); `make test` still runs everything
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests/unit $(PYTEST_ARGS)

demo: setup
	$(BIN)/triton-builder run examples/digits/spec.yaml

# a real Hugging Face model served text in, label out: MiniLM with a small trained head (examples/minilm/)
demo-hf: setup
	HF_HUB_OFFLINE=1 $(BIN)/python examples/minilm/prepare.py
	HF_HUB_OFFLINE=1 $(BIN)/triton-builder run examples/minilm/sentiment.yaml

# the docs site (mkdocs.yml) into build/site/, after rewriting docs/reference/cli.md and spec.md from the code with
# scripts/gen_docs_reference.py (tests/unit/test_docs_site.py fails when the committed ones are out of date)
docs: $(STAMP)
	$(BIN)/python scripts/gen_docs_reference.py
	$(BIN)/mkdocs build --strict

# the wheel installed into a fresh venv outside the checkout builds, serves and checks digits (CI runs it)
wheel-smoke: $(STAMP)
	bash scripts/wheel-smoke.sh

# the wheel installed WITHOUT the lock (today's resolution of its ranges) builds digits and a BERT-family module spec
# with every FP32 variant passing: upstream drift caught before users (CI runs it)
unlocked-smoke: $(STAMP)
	bash scripts/unlocked-smoke.sh

# benchmarks print figures; they are not tests (numbers depend on the machine and its load)
bench: setup
	$(BIN)/python benchmarks/quantization_speedup.py

bench-tuning: setup
	$(BIN)/python benchmarks/tuning_gain.py

# issue 14's serving targets: default config served vs in-process, digits at concurrency 16 (perf_analyzer)
bench-serving: setup
	$(BIN)/python benchmarks/serving_targets.py

bench-drift: setup
	$(BIN)/python benchmarks/drift_overhead.py
	$(BIN)/python benchmarks/drift_served_overhead.py

bench-replicas: setup
	$(BIN)/python benchmarks/replicas_throughput.py

bench-faults: setup
	$(BIN)/python benchmarks/fault_kills.py

bench-zoo: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/model_zoo.py

bench-compression: setup
	$(BIN)/python benchmarks/compression.py

bench-peers: setup
	$(BIN)/python benchmarks/quant_peers.py

# our default build vs onnxruntime, OpenVINO + NNCF and Hugging Face Optimum (its own venv, installed on first use)
# on the real all-MiniLM-L6-v2 and a ResNet-18, side by side in one run (issue 40)
bench-anchors: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/anchors.py

# the same with AVX-512, VNNI and AMX hidden from every process (an AVX2-only CPU's kernels on this host's cores;
# needs CPUID faulting: benchmarks/as_avx2_only.sh --check says what the runtimes see)
bench-anchors-avx2: setup
	HF_HUB_OFFLINE=1 benchmarks/as_avx2_only.sh $(BIN)/python benchmarks/anchors.py

# tune vs Triton Model Analyzer 1.58 (its own venv, installed on first use), same server and perf_analyzer
bench-vs-ma: setup
	$(BIN)/python benchmarks/vs_model_analyzer.py

# what each Triton release's onnxruntime / OpenVINO loads, measured beside builder/repository/triton_releases.py
bench-releases: setup
	$(BIN)/python benchmarks/release_limits.py

# a standard onnxruntime_onnx folder through the embedded server's stand-in vs the python-backend model (issue 34)
bench-standin: setup
	$(BIN)/python benchmarks/served_side_by_side.py standin

# issue 51: a text ensemble's model step batches (length buckets vs pad-to-longest), vs the model in-process
bench-text-batching: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/text_batching.py

# issue 48: the same standard folder served through the Python stand-in and through Triton's own C++ backend
bench-native: setup
	$(BIN)/python benchmarks/served_side_by_side.py native

bench-monitor: setup
	$(BIN)/python benchmarks/served_side_by_side.py monitor

bench-rollouts: setup  # 10 rollouts + 10 rollbacks under load at c=16, poll and explicit mode (~5 min)
	$(BIN)/python benchmarks/rollouts.py

bench-soak: setup  # 60 minutes: two models, drift on, a rollout every 10 min, a server kill (MINUTES=3 for a short one)
	$(BIN)/python benchmarks/soak.py --minutes $(or $(MINUTES),60)

# the MiniLM sentiment pipeline served (text in, label out) vs transformers' pipeline, vs its bare model with the
# same texts tokenized, and the per-step time split (issue 35; onnx + default variants, ~10-20 min on 2 cores)
bench-hf: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/hf_pipeline.py

clean:
	rm -rf runs .pytest_cache
