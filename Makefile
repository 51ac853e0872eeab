# samu: `make reproduce` regenerates the per-shape results, calibration and the report's figures,
# `make train` the training studies; `make test` runs the tests. PYTHON=/path/to/python uses an
# existing environment (e.g. a GPU machine's image) and installs nothing (`make lab` adds
# jupyterlab to it where it lacks one).
VENV := .venv
TORCH_SPEC ?= torch==2.13.0
ifeq ($(origin PYTHON), undefined)
PYTHON := $(VENV)/bin/python
SETUP := $(VENV)/.installed
else
SETUP :=
endif
# SHAPES reaches the program through the environment, as one quoted argument, so the shell
# never parses it; $(value) keeps make from expanding it either.
override SHAPES := $(value SHAPES)
export SHAPES
override GPU := $(value GPU)
export GPU
NBVAL_DATA := $(shell mktemp -d -u /tmp/samu-nbval.XXXXXX)

.PHONY: setup test reproduce report train lab notebooks clean

setup: $(SETUP)

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $@

# pytest over tests/, then nbval over the notebooks; notebook outputs go to a scratch data folder.
# pytest-xdist spreads the tests over TEST_WORKERS processes, one a core up to 16: under Triton's
# interpreter each test is single-threaded Python, and on a GPU machine Triton's compiles of each
# kernel variant are CPU-bound. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; n = min(16, os.cpu_count() or 1); print(n if n > 1 else 0)" 2>/dev/null || echo 0)
test: $(SETUP)
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) tests
	SAMU_DATA_DIR=$(NBVAL_DATA) $(PYTHON) -m pytest -q --nbval-lax -p no:cacheprovider notebooks
	rm -rf $(NBVAL_DATA)

reproduce: $(SETUP)
	PYTHONUNBUFFERED=1 $(PYTHON) -m samu.experiment.pipeline --shapes "$$SHAPES"

# The report alone (notebook 04) over the per-shape results in data/results/<GPU>/, for shapes
# run in several commands; GPU=nvidia-h200 names the GPU (default: this machine's; a GPU
# variable in the environment counts too). It reaches the program as SHAPES does.
report: $(SETUP)
	PYTHONUNBUFFERED=1 $(PYTHON) -m samu.experiment.pipeline --report="$$GPU"

# The training studies (notebook 05; samu.experiment.training.CONFIGURATIONS): CONFIG=small (the
# default on a GPU: recall, copying and a character LM at width 256), recall (Zoology's recall
# curves) or scale (L = 8192, width 512: where a recurrent step is cheaper than attention's), or
# all; at a GPU's size on CUDA, at a CPU's otherwise (without CONFIG on a CPU: all three).
# Executed notebook: data/runs/<gpu>/[<config>/][part-k-of-n/]05_training.ipynb; results:
# data/training/<gpu>[.<config>].json; figures: data/figures/<gpu>_training_[<config>_]*.png.
# PART=k runs the k-th of the configuration's parts (small 3, recall 12, scale 6: each under ten
# minutes on an H200, or each run under ten where the runs are long: recall's and scale's MQAR),
# writing data/training/<gpu>[.<config>].part-k-of-n.json; the part that finds every part's file merges
# them (parts written on other machines: python -m samu.experiment.training --config <config>
# --merge <gpu>).  A part stopped short goes on where it stopped when run again (a run from its
# last save, at most a minute back); a part whose file is written is not trained again.
train: $(SETUP)
	PYTHONUNBUFFERED=1 $(PYTHON) -m samu.experiment.training $(if $(CONFIG),--config $(CONFIG)) $(if $(PART),--part $(PART))

# JupyterLab on the repository root (notebooks/ and data/runs/ side by side); it prints the URL it
# serves. LAB_ARGS go to jupyter lab, e.g. make lab LAB_ARGS="--no-browser --port 8899". Jupyter
# refuses to run as root without --allow-root, so root gets it.
LAB_ARGS ?=
LAB_ROOT_FLAG = $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(SETUP)
	$(PYTHON) -c "import jupyterlab" 2>/dev/null || $(PYTHON) -m pip install -q jupyterlab
	@echo "JupyterLab on $(CURDIR): open notebooks/ or data/runs/ from its file browser; its URL follows."
	$(PYTHON) -m jupyterlab --ServerApp.root_dir="$(CURDIR)" $(LAB_ROOT_FLAG) $(LAB_ARGS)

notebooks: $(SETUP)
	$(PYTHON) tools/make_notebooks.py

clean:
	rm -rf $(VENV) .pytest_cache
