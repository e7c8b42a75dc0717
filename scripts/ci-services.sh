#!/usr/bin/env bash
# PostgreSQL and Redis for the scaled-out tests: start them when they are installed but down.
# Tests that need them skip with a reason when they are absent.
set -u
if command -v pg_ctlcluster >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 2>/dev/null; then
  echo "Starting PostgreSQL…"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
if command -v redis-server >/dev/null 2>&1 && ! redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then
  echo "Starting Redis…"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /tmp --logfile /tmp/redis-ci.log || true
fi
exit 0
