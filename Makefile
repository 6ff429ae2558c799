# Stitch: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20
CMAKE_FLAGS ?=
CLANG_FORMAT ?= clang-format
CLANG_TIDY ?= clang-tidy
SOURCES = $(shell git ls-files --cached --others --exclude-standard -- '*.cc' '*.h' 2>/dev/null)

.PHONY: all deps build test test-asan test-multihost test-engines fuzz format format-check lint
.PHONY: thread-safety
.PHONY: bench bench-activation bench-fleet bench-soak bench-trl clean demo demo-vllm demo-trl chaos chaos-short
.PHONY: python-install python-test trl-install test-trainers

all: build

deps:
	@scripts/install-deps

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTITCH_WERROR=ON $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: deps format-check build thread-safety
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600
	$(MAKE) --no-print-directory test-engines
	$(MAKE) --no-print-directory test-trainers
	$(MAKE) --no-print-directory chaos-short
	$(MAKE) --no-print-directory python-test
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory test-multihost

# The sidecar in front of real engines (tests/engines/): vLLM's CPU build
# and stock SGLang, installed once outside the tree by scripts/install-engines
# (about 6 and 10 GB), each started once for its suite; transformers judges
# every answer.
ENGINES ?= vllm sglang
ENGINES_DIR = $(shell scripts/install-engines --print-dir)
test-engines: build
	scripts/install-engines $(ENGINES)
	@for engine in $(ENGINES); do \
	  STITCH_BIN=$(CURDIR)/$(BUILD)/src/stitch/cli/stitch \
	    $(ENGINES_DIR)/$$engine/bin/python -m pytest -q -p no:cacheprovider \
	    tests/engines/test_$$engine*.py tests/engines/test_chaos_judge.py || exit 1; \
	done

# A fleet across hosts on this machine: network namespaces joined by a
# bridge, moto S3 and dnsmasq on their own hosts, replicas cut off, joining
# and leaving (tests/multihost/multihost_test.cc, a GoogleTest program that
# CTest leaves out). Needs root, as CI has.
test-multihost: deps build
	$(BUILD)/tests/multihost_netns_test

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSTITCH_WERROR=ON \
	  -DSTITCH_SANITIZE=ON -DSTITCH_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 900

# Fuzz targets (libFuzzer, clang), each run for a short bounded time.
fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_CXX_COMPILER=clang++ -DSTITCH_FUZZ=ON -DSTITCH_BENCH=OFF $(CMAKE_FLAGS) >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_targets
	@set -o pipefail; for f in $(FUZZ_BUILD)/fuzz/fuzz_*; do \
	  [ -x "$$f" ] || continue; \
	  echo "fuzz: $$(basename $$f) for $(FUZZ_SECONDS)s"; \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$(basename $$f); \
	  "$$f" -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=0 -artifact_prefix=$(FUZZ_BUILD)/ \
	    $(FUZZ_BUILD)/corpus/$$(basename $$f) fuzz/seeds/$$(basename $$f) 2>&1 | tail -n 2 || exit 1; \
	done

# The whole system at work on this machine: a trainer learning and publishing,
# a local fleet following behind a gateway, a replica joining and one killed.
# DEMO_FLAGS passes options through, e.g. DEMO_FLAGS="--steps 60 --keep".
DEMO_FLAGS ?=
demo: deps build
	$(BUILD)/src/stitch/cli/stitch demo $(DEMO_FLAGS)

# The same demo on real engines: each replica is a vLLM server (its CPU
# build, installed once by scripts/install-engines, started through
# scripts/vllm_serve.py by the demo's --engine-cmd template) behind its
# sidecar, following the trainer's deltas. Two replicas, since each vLLM takes
# about 4 GiB and a minute or more to start; the base model is bfloat16 with
# a head dimension of 32, as vLLM's CPU attention needs, and 256 positions.
# DEMO_FLAGS passes options through.
DEMO_VLLM_FLAGS ?= --replicas 2 --steps 24
# Stitch's worker extension (python/src/stitch_vllm) lets the sidecars commit
# sparse versions as in-place patches (--patch-commits).
VLLM_ENGINE_CMD = PYTHONPATH=$(CURDIR)/python/src $(ENGINES_DIR)/vllm/bin/python \
  $(CURDIR)/scripts/vllm_serve.py serve {model} \
  --host {host} --port {port} --served-model-name {served_model_name} --dtype bfloat16 \
  --max-model-len 256 --enforce-eager --max-num-seqs 8 --enable-prefix-caching \
  --worker-extension-cls stitch_vllm.WeightPatchExtension
demo-vllm: deps build
	scripts/install-engines vllm
	$(BUILD)/src/stitch/cli/stitch demo --engine-api vllm --engine-cmd '$(VLLM_ENGINE_CMD)' \
	  $(DEMO_VLLM_FLAGS) $(DEMO_FLAGS)

# The fault-injection suite (docs/chaos.md): a fleet on loopback under
# rollout load and a fault schedule drawn from CHAOS_SEED ("random" draws and
# prints one), for CHAOS_MINUTES per store configuration (CHAOS_STORE: fs,
# s3 or both). A failing run prints the command that replays it.
CHAOS_SEED ?= random
CHAOS_MINUTES ?= 5
CHAOS_STORE ?= both
CHAOS_FLAGS ?=
# CHAOS_ENGINE=vllm or sglang puts replica r0 on that real engine (installed
# once by scripts/install-engines; vLLM through VLLM_ENGINE_CMD below), its
# answers judged by transformers in the engine's environment.
CHAOS_ENGINE ?= reference
# Stitch's custom weight loader (python/src/stitch_sglang) lets its sidecar
# commit sparse versions as in-place patches.
CHAOS_SGLANG_CMD = PYTHONPATH=$(CURDIR)/python/src bash $(CURDIR)/tests/engines/sglang_serve.sh \
  {model} {port} --served-model-name {served_model_name} --weight-version chaos/weight_v000000 \
  --enable-metrics --custom-weight-loader stitch_sglang.apply_patch
CHAOS_ENGINE_FLAGS_reference =
CHAOS_ENGINE_FLAGS_vllm = --engine vllm --engine-cmd '$(VLLM_ENGINE_CMD)' \
  --judge-python $(ENGINES_DIR)/vllm/bin/python
CHAOS_ENGINE_FLAGS_sglang = --engine sglang --engine-cmd '$(CHAOS_SGLANG_CMD)' \
  --judge-python $(ENGINES_DIR)/sglang/bin/python
STITCH_CHAOS = $(BUILD)/src/stitch/cli/stitch chaos --python $(PYTHON_VENV)/bin/python \
  --moto-script tests/s3_moto.py $(CHAOS_FLAGS)
chaos: deps build
	@if [ "$(CHAOS_ENGINE)" != reference ]; then scripts/install-engines $(CHAOS_ENGINE) || exit 1; fi
	@for store in $(if $(filter both,$(CHAOS_STORE)),fs s3,$(CHAOS_STORE)); do \
	  $(STITCH_CHAOS) $(CHAOS_ENGINE_FLAGS_$(CHAOS_ENGINE)) --seed $(CHAOS_SEED) \
	    --minutes $(CHAOS_MINUTES) --store $$store || exit 1; \
	done

# The short run of `make test` (about 2 minutes): a fixed seed on the
# filesystem store, then a random seed (printed) on the S3 store.
chaos-short: build
	$(STITCH_CHAOS) --seed 1 --minutes 0.75 --store fs
	$(STITCH_CHAOS) --seed random --minutes 0.75 --store s3

# The activation pause inside a real engine, ENGINE=vllm (the default) or
# sglang (bench/activation_bench.py): a full reload against an in-place patch
# of the values that changed, and the floor, for two model sizes
# (ACTIVATION_BENCH_FLAGS passes options through; about 15 minutes each on
# two cores). Not part of `make bench`: it needs the engine.
ACTIVATION_BENCH_FLAGS ?=
ENGINE ?= vllm
bench-activation: build
	scripts/install-engines $(ENGINE)
	$(ENGINES_DIR)/$(ENGINE)/bin/python bench/activation_bench.py --engine $(ENGINE) \
	  --stitch $(BUILD)/src/stitch/cli/stitch $(ACTIVATION_BENCH_FLAGS)

bench: deps build python-install
	@for b in $(BUILD)/bench/*_bench; do \
	  case $$b in */fleet_bench|*/soak_bench) continue;; esac; echo "== $$b"; "$$b" || exit 1; done
	@echo "== bench/python_encode_bench.py"; $(PYTHON_VENV)/bin/python bench/python_encode_bench.py \
	  --floor-lib $(BUILD)/bench/libencode_floor.so

# Fleet scale on this machine (bench/fleet_bench.cc): N reference engines with
# their sidecars, idle and following publishes, with the reconciler's idle
# backoff off and on. FLEET_BENCH_FLAGS passes options (--replicas 1,16,64,256).
FLEET_BENCH_FLAGS ?=
bench-fleet: build
	$(BUILD)/bench/fleet_bench --stitch $(BUILD)/src/stitch/cli/stitch $(FLEET_BENCH_FLAGS)

# A run of weeks, compressed (bench/soak_bench.cc): 1000 publishes with
# retention and the anchor budget, a replica joining every 100 versions, a
# hold taken and released; the store's size, join times against the join at
# v10, wrong labels. About 5 minutes on two cores. SOAK_BENCH_FLAGS passes
# options through (--versions 200 for a quick look).
SOAK_BENCH_FLAGS ?=
bench-soak: build
	$(BUILD)/bench/soak_bench --stitch $(BUILD)/src/stitch/cli/stitch $(SOAK_BENCH_FLAGS)

format:
	$(CLANG_FORMAT) -i $(SOURCES)

format-check:
	@$(CLANG_FORMAT) --dry-run --Werror $(SOURCES) || \
	  { echo "make: unformatted sources above; run 'make format'"; exit 1; }

# Clang's thread-safety analysis, as an error, over every translation unit
# that meets a mutex, with the build's own flags (-fsyntax-only: no second
# build; units unchanged since they passed are skipped), so that
# ABSL_GUARDED_BY means something whatever compiler builds the project.
thread-safety: deps $(BUILD)/build.ninja
	scripts/thread-safety --build $(BUILD) --jobs $(JOBS)

lint: deps $(BUILD)/build.ninja
	$(CLANG_TIDY) -p $(BUILD) --quiet $(filter %.cc,$(SOURCES))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) build-python

# The Python package (pyproject.toml, sources in python/): built into the
# project venv, incrementally in build-python/ ($(JOBS) compile jobs: it
# builds net and api too, for the pool's wakes), then its pytest suite. With
# a built `stitch` ($(BUILD), after `make build`) it is installed into the
# venv's bin too, for `python -m stitch.sidecar`; the suite's tests that run
# it are skipped without one.
PYTHON_VENV ?= .venv
PYTHON_JOBS ?= $(JOBS)
STITCH_EXE = $(BUILD)/src/stitch/cli/stitch
python-install: deps
	CMAKE_BUILD_PARALLEL_LEVEL=$(PYTHON_JOBS) $(PYTHON_VENV)/bin/pip install --quiet \
	  --no-build-isolation -C build-dir=build-python/{wheel_tag} \
	  -C cmake.define.STITCH_BINARY=$(if $(wildcard $(STITCH_EXE)),$(CURDIR)/$(STITCH_EXE)) .

python-test: python-install
	$(PYTHON_VENV)/bin/python -m pytest -q python/tests

# A real trainer: Hugging Face TRL (its own environment, installed once by
# scripts/install-engines trl, with the stitch package built above as a
# wheel) driving a fleet through stitch.integrations.trl.
TRL_PYTHON = $(ENGINES_DIR)/trl/bin/python
UV = $(shell command -v uv 2>/dev/null || echo $(ENGINES_DIR)/uv/bin/uv)
trl-install: python-install
	scripts/install-engines trl
	rm -rf build-python/wheels
	CMAKE_BUILD_PARALLEL_LEVEL=$(PYTHON_JOBS) $(PYTHON_VENV)/bin/pip wheel --quiet --no-deps \
	  --no-build-isolation -C build-dir=build-python/{wheel_tag} -w build-python/wheels \
	  -C cmake.define.STITCH_BINARY=$(if $(wildcard $(STITCH_EXE)),$(CURDIR)/$(STITCH_EXE)) .
	$(UV) pip install --quiet --python $(TRL_PYTHON) --reinstall --no-deps build-python/wheels/stitch-*.whl

# TRL's GRPOTrainer learning from a fleet of reference engines through the
# gateway, and from a real vLLM behind a sidecar (tests/trainers/).
test-trainers: build trl-install
	scripts/install-engines vllm
	STITCH_BIN=$(CURDIR)/$(STITCH_EXE) STITCH_VLLM_PYTHON=$(ENGINES_DIR)/vllm/bin/python \
	  $(TRL_PYTHON) -m pytest -q -p no:cacheprovider tests/trainers

# The same with TRL as the trainer (examples/trl_grpo.py): a local fleet of
# reference engines, or real vLLM servers with TRL_ENGINE=vllm.
TRL_ENGINE ?= reference
DEMO_TRL_FLAGS ?=
demo-trl: deps build trl-install
	@if [ "$(TRL_ENGINE)" = vllm ]; then scripts/install-engines vllm || exit 1; fi
	$(TRL_PYTHON) examples/trl_grpo.py --stitch $(STITCH_EXE) --engine $(TRL_ENGINE) \
	  --vllm-python $(ENGINES_DIR)/vllm/bin/python $(DEMO_TRL_FLAGS)

# Stitch's share of a TRL step, and rollouts through gateway and sidecar
# against the same calls made straight to the engines (bench/trl_bench.py).
bench-trl: build trl-install
	$(TRL_PYTHON) bench/trl_bench.py --stitch $(STITCH_EXE)
