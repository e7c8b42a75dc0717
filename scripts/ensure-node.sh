#!/usr/bin/env bash
# The page's unit tests (tests/js) run under Node's built-in test runner; install Debian's
# nodejs when node is missing and we can.
set -u
command -v node >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian's nodejs for the page's unit tests…"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq nodejs >/dev/null && exit 0
fi
echo "WARNING: node is not installed; the page's unit tests (tests/js) will be skipped." >&2
echo "         Install it with: sudo apt-get install nodejs" >&2
exit 0
