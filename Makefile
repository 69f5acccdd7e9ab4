# Two set-up commands: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench accuracy profiles clean system-packages

# the suite's workers: one and a half per core. A third of the suite's time is spent waiting
# (on clocks: budgets held by the clock, stalled and hung runs; on other processes: nodes,
# servers, a browser), which a third worker fills; more only contend for the cores.
WORKERS ?= $(shell $(PY) -c "import os; print(max(2, (os.cpu_count() or 2) * 3 // 2))")

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first: keep a torch that is already there (a user's CUDA build); otherwise take the
# pinned CPU build so that a CPU-only machine never downloads multi-GB CUDA wheels. (Their
# bytecode is compiled at install: where PYTHONDONTWRITEBYTECODE is set, as on our machines,
# nothing would ever compile it later, and every process of the suite would compile torch.)
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]" -c constraints.txt
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/frugal plan meta-llama/Llama-3.1-8B --tokens 20M --methods lora,qlora --deadline 24 --tag project=demo --write frugal.yaml --force
	$(BIN)/frugal estimate meta-llama/Llama-3.1-8B --method qlora --gpu "RTX 4090"
	$(BIN)/frugal train examples/tiny-train.yaml --output-dir runs/demo --tag project=demo
	$(BIN)/frugal train examples/sentiment/run.yaml --output-dir runs/demo-sentiment --tag project=demo
	$(BIN)/frugal costs report --by project
	$(BIN)/frugal serve plan meta-llama/Llama-3.1-8B --rate 20 --input-len 1000 --output-len 200 --ttft-ms 500
	@echo "the books in a browser: $(BIN)/frugal dashboard  (then open http://localhost:8050/api/docs)"

# the suite in $(WORKERS) processes; a worker takes the next test as it finishes one. The
# system packages its tests drive (PostgreSQL, Chromium) are installed where missing, while
# the Python packages install. frugal's own modules are compiled first: where
# PYTHONDONTWRITEBYTECODE is set, each of the suite's processes would compile them again.
test:
	@$(MAKE) --no-print-directory -j2 $(STAMP) system-packages
	@$(BIN)/python -m compileall -q src tests > /dev/null
	$(BIN)/python -m pytest -n $(WORKERS) --dist worksteal --durations=15

system-packages:
	@bash scripts/system-packages

# everyday work: the tests not marked slow (under a minute)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

bench: $(STAMP)
	$(BIN)/python benchmarks/estimate_speed.py
	$(BIN)/python benchmarks/plan_speed.py
	$(BIN)/python benchmarks/train_overhead.py

# the bundled models' profiles for the common jobs, shipped in the package: after changing
# what the step runs (bump frugal.step.STEP_FORMAT), or upgrading torch, transformers or
# peft (a test says when)
profiles: $(STAMP)
	$(BIN)/python benchmarks/make_profiles.py

accuracy: $(STAMP)
	$(BIN)/python benchmarks/estimate_accuracy.py --write docs/accuracy.md

clean:
	rm -rf $(VENV) build dist src/*.egg-info
