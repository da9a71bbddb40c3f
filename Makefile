# SpecKernels: the two commands of the README's quick start, and a few more.
#   make lab    install everything into .venv and open the course in JupyterLab
#   make test   install everything into .venv and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: lab test lint release gpu-test gpu-sanitize clean

# JupyterLab refuses to run as root (as in many containers) unless told it may.
LAB_FLAGS := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(BIN)/jupyter lab $(LAB_FLAGS) notebooks/00_setup_and_tour.ipynb

# Notebooks run with the reference solutions (students' lessons/ are stubs until they write them).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m course release --check
	COURSE_IMPL=solutions $(BIN)/python -m pytest -n 2 --dist loadfile --nbval-lax tests notebooks

lint: $(STAMP)
	$(BIN)/ruff check .

release: $(STAMP)
	$(BIN)/python -m course release

# On a machine with a GPU and the course installed (see README, "Running on a GPU").
gpu-test:
	COURSE_SIM=0 COURSE_IMPL=solutions $(PYTHON) -m pytest -p no:cacheprovider --nbval-lax tests notebooks

# compute-sanitizer (memcheck and racecheck) over every Numba kernel's check: 0 errors wanted.
gpu-sanitize:
	$(PYTHON) -m course sanitize

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV)
