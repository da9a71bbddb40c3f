# SpecKernels: the two commands of the README's quick start, and a few more.
#   make lab    install everything into .venv and open the course in JupyterLab
#   make test   install everything into .venv and run the whole test suite
# The install (tools/install.py) picks torch's CPU build without a GPU and its CUDA build with one.
#   GPU=0 / GPU=1     override the guess (an NVIDIA GPU is there when `nvidia-smi -L` lists one)
#   SYSTEM_TORCH=1    keep the torch that $(PYTHON) already has (the venv sees the system's packages)
#   PYTHON=python3.12 the Python the venv is made from (3.11 to 3.14)
PYTHON       ?= python3
VENV         ?= .venv
BIN          := $(VENV)/bin
GPU          ?= $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo 1 || echo 0)
SYSTEM_TORCH ?= 0
MODE         := $(if $(filter 1,$(SYSTEM_TORCH)),system-)$(if $(filter 1,$(GPU)),gpu,cpu)
STAMP        := $(VENV)/.installed-$(MODE)

.PHONY: lab test lint release resolve gpu-test gpu-sanitize clean

# JupyterLab refuses to run as root (as in many containers) unless told it may.
LAB_FLAGS := $(if $(filter 0,$(shell id -u)),--allow-root)

# The server's root is the repository (lessons/ is one click away), notebook 00 opens first, and
# the venv leads PATH so that a Lab terminal finds the course's Python. LAB_ARGS passes more.
lab: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter lab $(LAB_FLAGS) --ServerApp.root_dir="$(CURDIR)" \
		--LabApp.default_url=/lab/tree/notebooks/00_setup_and_tour.ipynb $(LAB_ARGS)

# Notebooks run with the reference solutions (students' lessons/ are stubs until they write them).
# The tests run in a shuffled order (pytest-randomly; a notebook's cells keep theirs): the seed is
# printed first, and `make test TEST_SEED=<seed>` replays that order.
ifndef TEST_SEED
TEST_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m course release --check
	@echo "test order: shuffled with seed $(TEST_SEED); replay it with: make test TEST_SEED=$(TEST_SEED)"
	COURSE_IMPL=solutions $(BIN)/python -m pytest -n 2 --dist loadfile -p randomly --randomly-seed=$(TEST_SEED) \
		--nbval-lax tests notebooks

lint: $(STAMP)
	$(BIN)/ruff check .

release: $(STAMP)
	$(BIN)/python -m course release

# With a Python that already holds the course's packages, no install (README, "Running on a GPU").
# PYTEST_FLAGS passes more, e.g. PYTEST_FLAGS="-n 4 --dist loadfile".
gpu-test:
	COURSE_SIM=0 COURSE_IMPL=solutions $(PYTHON) -m pytest -p no:cacheprovider $(PYTEST_FLAGS) --nbval-lax \
		tests notebooks

# compute-sanitizer (memcheck and racecheck) over every Numba and Triton kernel's check: 0 errors wanted.
gpu-sanitize:
	$(PYTHON) -m course sanitize

# Written by the installer only after every step succeeded: a broken-off install is redone.
$(STAMP): pyproject.toml tools/install.py
	$(PYTHON) tools/install.py install --venv $(VENV) --python $(PYTHON) --extras dev --gpu $(GPU) \
		$(if $(filter 1,$(SYSTEM_TORCH)),--system-torch)

# Can the public package index alone satisfy the pins, for the CPU and the GPU sets? (Metadata only.)
resolve:
	$(PYTHON) tools/install.py resolve --python $(PYTHON)

clean:
	rm -rf $(VENV)
