# `make train` and `make test` each build .venv first when it is missing or
# older than pyproject.toml.
VENV := .venv
PYTHON := $(VENV)/bin/python
# For pytest's own process, glibc's malloc settings of vit_jax/runtime.py
# (huge pages, freed step buffers kept for the next step), which glibc reads
# only when a process starts; tests/conftest.py sets the rest (8 emulated
# CPU devices). `python -m vit_jax.main` picks TCMalloc where the host has it.
TEST_ENV = GLIBC_TUNABLES=$(shell JAX_PLATFORMS=cpu $(PYTHON) -c \
	'from vit_jax import runtime; print(runtime.glibc_tunables(""))')

.PHONY: train test transfer mae dino docs_figures clean

# pip's -qq: its errors only, not the warnings of this machine's pip
# settings or of the editable build.
$(VENV)/installed: pyproject.toml
	@echo "Installing vit_jax and its dependencies into $(VENV) (once; a few minutes)"
	@test -x $(PYTHON) || python3 -m venv $(VENV)
	@$(PYTHON) -m pip install -qq --upgrade pip
	@$(PYTHON) -m pip install -qq -e '.[test]'
	@touch $@

# The embedded default: the README's training command, a small ViT on 8x8
# digits over the devices this machine has, then the Section 4.5 figures and
# training curves of the run in workdir/digits/figures. Rerunning resumes (or
# reports) the run.
train: $(VENV)/installed
	$(PYTHON) -m vit_jax.main --config=configs/digits.py --workdir=workdir/digits
	$(PYTHON) -m vit_jax.figures --workdir=workdir/digits

# Pre-train on digits 0-4 at 8x8, fine-tune on 5-9 at 16x16, and train the
# same model on 5-9 from scratch with the same budget (configs/digits_transfer.py).
# In bash with pipefail: a pipe's status is otherwise sed's, and a stage that
# failed would go on to the next (dash, /bin/sh on Debian, has no pipefail).
transfer: SHELL := /bin/bash
transfer: $(VENV)/installed
	set -o pipefail; for run in pretrain finetune scratch probe; do \
	  $(PYTHON) -m vit_jax.main --config=configs/digits_transfer.py:$$run \
	    --workdir=workdir/transfer/$$run | sed "s/^/$$run: /" || exit 1; \
	done

# A masked autoencoder pre-trained on the digits without labels, fine-tuned
# from 10 labels a digit, and the same fine-tuning from scratch
# (configs/mae/digits.py, docs/mae.md).
mae: SHELL := /bin/bash
mae: $(VENV)/installed
	set -o pipefail; for run in pretrain finetune scratch probe; do \
	  $(PYTHON) -m vit_jax.main --config=configs/mae/digits.py:$$run \
	    --workdir=workdir/mae/$$run | sed "s/^/$$run: /" || exit 1; \
	done

# Self-distillation (DINOv2's recipe) on the digits without labels, then
# the same fine-tunings (configs/dino/digits.py, docs/dino.md).
dino: SHELL := /bin/bash
dino: $(VENV)/installed
	set -o pipefail; for run in pretrain finetune scratch; do \
	  $(PYTHON) -m vit_jax.main --config=configs/dino/digits.py:$$run \
	    --workdir=workdir/dino/$$run | sed "s/^/$$run: /" || exit 1; \
	done

# The digits figures that docs/figures.md shows (docs/digits_*.png): a fresh run
# of `make train`'s command, then its figures, copied over the old ones.
docs_figures: $(VENV)/installed
	rm -rf workdir/docs_digits
	$(PYTHON) -m vit_jax.main --config=configs/digits.py --workdir=workdir/docs_digits
	$(PYTHON) -m vit_jax.figures --workdir=workdir/docs_digits
	for png in workdir/docs_digits/figures/*.png; do \
	  cp "$$png" "docs/digits_$$(basename "$$png")" || exit 1; \
	done

# PYTEST_ARGS: more of pytest's arguments, e.g. a file, -k, or coverage's.
test: $(VENV)/installed
	$(PYTHON) -m ruff check --quiet .
	$(TEST_ENV) $(PYTHON) -m pytest -n 2 --dist worksteal -q --durations=40 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) workdir
