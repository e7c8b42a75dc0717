#!/usr/bin/env bash
# The browser tests drive Debian's Chromium; install it when it is missing and we can.
set -u
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian's chromium for the browser tests…"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null && exit 0
fi
echo "WARNING: chromium is not installed; the browser tests will be skipped." >&2
echo "         Install it with: sudo apt-get install chromium" >&2
exit 0
