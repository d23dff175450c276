# Set-up is part of every target: a fresh clone needs only `make train` or `make test`. Each target installs the
# dependency groups of pyproject.toml it needs, once, at the versions uv.lock holds: `make train` the core alone;
# `make test` adds `test`, `make lint` adds `lint`, `make docs` adds `docs`. After editing pyproject.toml's
# dependencies: `make lock`, and commit uv.lock with it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# uv installs from the lock (`--locked`: a lock that no longer matches pyproject.toml stops the install, naming the fix);
# this release of it goes into the venv, so every machine resolves the same way.
UV_VERSION := 0.13.9
UV := $(BIN)/uv
export UV_PROJECT_ENVIRONMENT := $(VENV)
# Installed packages are compiled to bytecode once, as pip does: without it each process compiles torch and Lightning
# anew wherever PYTHONDONTWRITEBYTECODE is set (many CI and container images), seconds per process. Set but empty
# counts as unset (uv refuses an empty value); UV_COMPILE_BYTECODE=0 turns it off.
export UV_COMPILE_BYTECODE := $(or $(strip $(UV_COMPILE_BYTECODE)),1)
CONFIG ?= configs/simple_cnn.yaml
ARGS ?=
# glibc's default malloc thresholds make CPU timings swing by +-30%; these pin them.
export MALLOC_MMAP_THRESHOLD_ ?= 33554432
export MALLOC_TRIM_THRESHOLD_ ?= 1073741824

.PHONY: install lock data train test test-all test-newest test-lowest matrix resume-fuzz resume-fuzz-ddp lint format hooks docs clean transfer fortunes text-data
# extra:timm
.PHONY: transfer-timm
# /extra:timm
# extra:hf
.PHONY: hf-pretrain
# /extra:hf
# extra:search
.PHONY: tune seeds
# /extra:search
# extra:serving
.PHONY: serve
# /extra:serving
# extra:benchmarks
.PHONY: bench bench-main bench-quick bench-gpu
# extra:streaming
.PHONY: bench-scale
# /extra:streaming
# extra:serving
.PHONY: bench-serve
# /extra:serving
# /extra:benchmarks

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Needs Python 3.11 or newer: make PYTHON=python3.12 ..."; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(BIN)/pip install --quiet uv==$(UV_VERSION)

# The core and the project itself (editable). `--inexact` keeps the groups other targets installed.
$(VENV)/.installed: pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked --inexact
	touch $@

# A dependency group of pyproject.toml on top of the core: .venv/.installed-test, -lint, -docs, ...
$(VENV)/.installed-%: $(VENV)/.installed
	$(UV) sync --locked --inexact --extra $*
	touch $@

# uv.lock again from pyproject.toml (the package index, reachable), keeping the locked versions that still fit.
lock: | $(UV)
	$(UV) lock

.PRECIOUS: $(VENV)/.installed-%
install: $(VENV)/.installed

# Fashion-MNIST where the datamodule finds it (a missing copy: one line saying where to put it).
data: install
	$(BIN)/python -m lightning_template.tasks.classification.data.mnist

# What `make train` prepares first: the fortunes for the text jobs, nothing for your own image folders
# (configs/resnet_finetune.yaml reads data/images/), Fashion-MNIST otherwise.
JOB_DATA := $(if $(findstring transformer_text,$(CONFIG)),text-data,$(if $(findstring resnet_finetune,$(CONFIG)),install,data))
# extra:language_model
JOB_DATA := $(if $(findstring language_model,$(CONFIG)),fortunes $(VENV)/.installed-lm,$(JOB_DATA))
# /extra:language_model
# extra:timm
JOB_DATA := $(if $(findstring timm_finetune,$(CONFIG)),install,$(JOB_DATA))$(if $(findstring timm,$(CONFIG)), $(VENV)/.installed-timm)
# /extra:timm
# extra:hf
JOB_DATA := $(if $(findstring hf_,$(CONFIG)),text-data $(VENV)/.installed-hf,$(JOB_DATA))
# /extra:hf
TRAIN_DATA ?= $(JOB_DATA)
train: $(TRAIN_DATA)
	$(BIN)/python train.py fit --config $(CONFIG) $(ARGS)

# extra:search
# Hyperparameter search, the command of docs/experiments.md; run it again to continue a stopped search.
TRIALS ?= 12
tune: data $(VENV)/.installed-tune
	$(BIN)/python tune.py --config $(CONFIG) --search configs/search/$(notdir $(CONFIG)) --trials $(TRIALS) \
		--study $(basename $(notdir $(CONFIG))) --seed 0 --trainer.max_epochs=3 --test_after_fit=false $(ARGS)

# The job over 3 seeds, mean ± std of its validation and test metrics.
seeds: data $(VENV)/.installed-tune
	$(BIN)/python multirun.py --config $(CONFIG) --seeds 42 7 123 $(ARGS)
# /extra:search

# What to run after every change (about 40 s on 2 idle CPU cores): each job for a few steps, your own model
# and data, resume at a glance, the quick checks. `worksteal`: a process that runs out of tests takes some of the
# other's, so neither waits at the end.
FAST_TESTS := -n auto --dist worksteal -m "not slow and not matrix"
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(FAST_TESTS)

# `make test` against what pyproject.toml allows rather than what uv.lock holds (the lock untouched), each in a venv of
# its own made anew (under .venv/, from uv's cache after the first time): test-newest with the newest releases of
# torch, torchvision, Lightning, torchmetrics and the rest; test-lowest with the lowest each lower bound allows (uv's
# --resolution lowest-direct; the packages they need, the newest that fit).
test-newest: RESOLUTION := highest
test-lowest: RESOLUTION := lowest-direct
test-newest test-lowest: | $(UV)
	rm -rf $(VENV)/$(@:test-%=%)
	$(UV) venv --quiet --python $(BIN)/python $(VENV)/$(@:test-%=%)
	$(UV) pip install --python $(VENV)/$(@:test-%=%) --resolution $(RESOLUTION) --editable '.[test]'
	$(UV) pip list --python $(VENV)/$(@:test-%=%) | grep -E '^(torch|torchvision|lightning|torchmetrics) '
	$(VENV)/$(@:test-%=%)/bin/python -m pytest $(FAST_TESTS)

# Every test but the setups matrix (about 21 minutes on 2 idle CPU cores): processes, DDP, signals, generated
# projects, every preset. One process per core, as `make test`; then the tests whose processes meet on a local port,
# one at a time: a port picked free for one such run could otherwise be taken by another's connections.
test-all: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n auto --dist worksteal -m "not matrix and not processes"
	$(BIN)/python -m pytest -m "processes and not matrix"

# One folder of tests: make test-NAME runs tests/NAME/.
test-%: $(VENV)/.installed-test
	$(BIN)/python -m pytest tests/$*

# Exact resume over setups drawn by Hypothesis (tests/test_generated_setups.py): EXAMPLES of them (a few seconds each),
# SEED=N another set; a failure prints its smallest setup and the command that replays it.
EXAMPLES ?= 200
SEED ?= 0
resume-fuzz: $(VENV)/.installed-test
	RESUME_FUZZ_EXAMPLES=$(EXAMPLES) RESUME_FUZZ_SEED=$(SEED) $(BIN)/python -m pytest \
		tests/test_generated_setups.py::test_a_generated_setup_resumes_exactly_or_is_told_why_not \
		-p no:logging -q --hypothesis-show-statistics

# The same under DDP: 2 processes on the CPU, each run started as `python train.py` (about 25 seconds a setup).
resume-fuzz-ddp: $(VENV)/.installed-test
	RESUME_FUZZ_DDP_EXAMPLES=$(EXAMPLES) RESUME_FUZZ_SEED=$(SEED) $(BIN)/python -m pytest \
		tests/test_generated_setups.py::test_a_generated_ddp_setup_resumes_exactly_or_is_told_why_not \
		-p no:logging -q --hypothesis-show-statistics

# The setups matrix: the whole exact-resume fault-injection matrix (100 cells, about 5 minutes), with its table, and the
# CLI resume of every job config and callback preset (about 6 minutes).
matrix: $(VENV)/.installed-test
	$(BIN)/python -m pytest tests/test_resume.py -m matrix -s -q
	$(BIN)/python -m pytest -m matrix --ignore=tests/test_resume.py -q

# extra:benchmarks
# Framework overhead, end-to-end ratio, throughput and fraction of peak, loading: medians over
# interleaved repeats (about 8 minutes on 2 CPU cores; bench-quick: the same table in under 3).
bench: data
	$(BIN)/python -m benchmarks.run $(ARGS)

# `make train`'s job for 3 seeds, alternating with the previous default (configs/simple_cnn_classic.yaml):
# wall time and test accuracy per seed, mean ± std (about 25 minutes on 2 CPU cores).
bench-main: data
	$(BIN)/python -m benchmarks.main_job $(ARGS)

bench-quick: data
	$(BIN)/python -m benchmarks.run --quick $(ARGS)

# On a CUDA machine, unattended (about 6 minutes): throughput by precision/compile/channels_last, overhead, DDP.
bench-gpu: data
	bash benchmarks/gpu.sh $(ARGS)

# extra:streaming
# How memory and epoch time grow with the data (in memory, files, streaming), the 224 px image
# pipeline against torchvision's, and DDP on 1 vs 2 processes (about 10 minutes on 2 CPU cores).
bench-scale: data
	$(BIN)/python -m benchmarks.scaling
# /extra:streaming

# extra:serving
# Requests/s and latency of serve.py (torch and ONNX) at 1, 8, 32 clients, next to train.py predict.
bench-serve: data text-data $(VENV)/.installed-serve $(VENV)/.installed-export
	$(BIN)/python -m benchmarks.serving
# /extra:serving
# /extra:benchmarks

# extra:serving
# HTTP API for a checkpoint: make serve CKPT=logs/simple_cnn/version_0/checkpoints/last.ckpt
# (default: the newest last.ckpt of $(CONFIG)'s runs)
CKPT ?= $(shell ls -t logs/$(basename $(notdir $(CONFIG)))/version_*/checkpoints/last.ckpt 2>/dev/null | head -1)
serve: $(VENV)/.installed-serve
	@test -n "$(CKPT)" || { echo "No checkpoint of $(CONFIG) in logs/: make train first, or make serve CKPT=<path>"; exit 1; }
	$(BIN)/python serve.py --ckpt_path $(CKPT) $(ARGS)
# /extra:serving

lint: $(VENV)/.installed-lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m tests.engine_boundary --check

format: $(VENV)/.installed-lint
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The checks of .pre-commit-config.yaml (ruff, end of files, large files) before each commit, with the tools of this
# venv: `git commit` runs them, no venv to activate.
hooks: $(VENV)/.installed-lint
	$(BIN)/pre-commit install

# The documentation site (docs/, mkdocs.yml) into site/; a broken link or anchor fails the build.
docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict

clean:
	rm -rf logs lightning_logs .pytest_cache site

# Transfer-learning recipe (docs/finetuning.md): pretrain on classes 0-4, fine-tune on 100 images/class of 5-9, compare to scratch.
# Steps 2 and 3 are the same job; step 2 stacks the two-stage fine-tuning preset on it. ARGS go to both (a seed, a size).
transfer: data
	$(BIN)/python train.py fit --config configs/resnet_fmnist_pretrain.yaml
	$(BIN)/python train.py fit --config configs/resnet_fmnist_small.yaml --config configs/presets/transfer.yaml \
		--trainer.logger.init_args.name resnet_fmnist_transfer \
		--model.weights "$$(ls -t logs/resnet_fmnist_pretrain/*/checkpoints/last.ckpt | head -n 1)" $(ARGS)
	$(BIN)/python train.py fit --config configs/resnet_fmnist_small.yaml --trainer.logger.init_args.name resnet_fmnist_scratch \
		$(ARGS)

# extra:timm
# The same recipe with a timm backbone in place of ResNet-18 (configs/presets/timm.yaml on each step): make
# transfer-timm BACKBONE=resnet18 ARGS="--seed_everything 7". Runs are named timm_<backbone>_fmnist_{pretrain,...}.
BACKBONE ?= convnext_atto
TIMM := --config configs/presets/timm.yaml --model.backbone $(BACKBONE)
transfer-timm: data $(VENV)/.installed-timm
	$(BIN)/python train.py fit --config configs/resnet_fmnist_pretrain.yaml $(TIMM) \
		--trainer.logger.init_args.name timm_$(BACKBONE)_fmnist_pretrain
	$(BIN)/python train.py fit --config configs/resnet_fmnist_small.yaml $(TIMM) --config configs/presets/transfer.yaml \
		--trainer.logger.init_args.name timm_$(BACKBONE)_fmnist_transfer \
		--model.weights "$$(ls -t logs/timm_$(BACKBONE)_fmnist_pretrain/*/checkpoints/last.ckpt | head -n 1)" $(ARGS)
	$(BIN)/python train.py fit --config configs/resnet_fmnist_small.yaml $(TIMM) \
		--trainer.logger.init_args.name timm_$(BACKBONE)_fmnist_scratch $(ARGS)
# /extra:timm
# extra:hf

# A small BERT pretrained here by masked-language modelling on the fortunes (configs/hf_pretrain.yaml), written into
# models/fortunes-bert: the encoder `make train CONFIG=configs/hf_fortunes.yaml` fine-tunes.
hf-pretrain: text-data $(VENV)/.installed-hf
	$(BIN)/python train.py fit --config configs/hf_pretrain.yaml $(ARGS)
# /extra:hf

# Real text: Debian's fortunes, or the folder FORTUNES_DIR names.
fortunes: install
	@test -d "$${FORTUNES_DIR:-/usr/share/games/fortunes}" || { echo "Needs fortune files: sudo apt-get install fortunes, or FORTUNES_DIR=<their folder>"; exit 1; }

# Real text data for configs/transformer_text.yaml: fortune cookies by topic.
text-data: fortunes
	$(BIN)/python -m lightning_template.tasks.classification.data.fortunes data/fortunes
