#!/usr/bin/env bash
# Starts the whole stack on the embedded default: the inference server with the bundled
# model, then the site under daphne once the model is ready. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SITE_HOST=${SITE_HOST:-127.0.0.1}
SITE_PORT=${SITE_PORT:-8000}
INFERENCE_PORT=${INFERENCE_PORT:-8001}
export INFERENCE_URLS=${INFERENCE_URLS:-http://127.0.0.1:$INFERENCE_PORT}
export PYTHONUNBUFFERED=1

# 200 from a URL, without needing curl on the machine.
ok() { "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" >/dev/null 2>&1; }

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo; echo "Stopping…"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

echo "==> Preparing the database"
"$PY" manage.py migrate --noinput

echo "==> Starting the inference server on 127.0.0.1:$INFERENCE_PORT (first start converts the model: ~1 min)"
# Output goes through process substitution, not a pipe, so $! is the server itself.
PORT=$INFERENCE_PORT "$PY" -m inference > >(sed -u 's/^/[inference] /') 2>&1 &
pids+=($!)

start=$(date +%s)
until ok "http://127.0.0.1:$INFERENCE_PORT/ready"; do
  if ! kill -0 "${pids[0]}" 2>/dev/null; then echo "The inference server exited; see its output above." >&2; exit 1; fi
  sleep 1
  elapsed=$(( $(date +%s) - start ))
  (( elapsed % 10 == 0 )) && echo "    waiting for the model to load… ${elapsed}s"
done
echo "    model ready after $(( $(date +%s) - start ))s"

echo "==> Starting the site on $SITE_HOST:$SITE_PORT"
# daphne with uvloop and a listen backlog for bursts of new pages (tokenstream_site/serve.py).
SITE_HOST=$SITE_HOST SITE_PORT=$SITE_PORT "$PY" -m tokenstream_site.serve > >(sed -u 's/^/[site] /') 2>&1 &
pids+=($!)
until ok "http://$SITE_HOST:$SITE_PORT/accounts/login/"; do sleep 0.3; done

cat <<MSG

  tokenstream is running: open http://$SITE_HOST:$SITE_PORT/
  New here? Create an account at http://$SITE_HOST:$SITE_PORT/accounts/signup/
  (staff account for the admin: $PY manage.py createsuperuser)
  Press Ctrl-C to stop both processes.

MSG
wait -n
