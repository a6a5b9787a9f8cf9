#!/usr/bin/env bash
# Makes sure Prometheus's promtool and server (Debian's prometheus package)
# are installed, for `make test` (promtool checks the monitoring examples
# and both /metrics endpoints; the e2e metrics tests scrape with a real
# server). It installs them with apt-get when missing and we may (root,
# apt-get present), without starting the packaged service. Exits 0 when
# both are there, 1 (with the reason) when they cannot be had.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus not installed, and apt-get cannot install it here (needs root and apt-get): apt-get install -y prometheus" >&2
  exit 1
fi
echo "installing prometheus with apt-get..." >&2
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the package's service from starting.
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
rc=0
apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 ||
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || rc=$?
[ -n "$made_policy" ] && rm -f "$policy"
if [ "$rc" != 0 ]; then
  echo "apt-get could not install prometheus" >&2
  exit 1
fi
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1
