# tokenstream: `make run` starts the whole stack, `make test` runs every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test format venv bench-inference bench-relay clean

$(STAMP): requirements.txt scripts/install.sh
	@PYTHON=$(PYTHON) bash scripts/install.sh

venv: $(STAMP)

run: $(STAMP)
	@PY=$(PY) bash scripts/run.sh

test: $(STAMP)
	@bash scripts/ensure-debian-package.sh chromium chromium "the browser tests"
	@bash scripts/ensure-debian-package.sh node nodejs "the page's unit tests (tests/js)"
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	@if command -v node >/dev/null 2>&1; then echo "node --test tests/js/"; node --test tests/js/; fi
	$(PY) -m pytest $(PYTEST_ARGS)

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench-inference: $(STAMP)
	$(PY) -m bench.inference $(ARGS)

bench-relay: $(STAMP)
	$(PY) -m bench.relay $(ARGS)

clean:
	rm -rf $(VENV) var artifacts
