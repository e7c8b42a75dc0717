#!/usr/bin/env bash
# ensure-debian-package.sh COMMAND PACKAGE WHAT
# Some tests need a program from Debian (chromium for the browser tests, nodejs for the
# page's unit tests): install PACKAGE when COMMAND is missing and we can (root with apt);
# otherwise warn that WHAT will be skipped.
set -u
command=$1 package=$2 what=$3
command -v "$command" >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian's $package for $what…"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq "$package" >/dev/null && exit 0
fi
echo "WARNING: $command is not installed; $what will be skipped." >&2
echo "         Install it with: sudo apt-get install $package" >&2
exit 0
