#!/usr/bin/env bash
# Makes sure HAProxy (Debian's haproxy package, 2.6 on bookworm) is
# installed, for `make test`, `make bench` and `make demo`. It installs it
# with apt-get when it is missing and we may (root, apt-get present). Exits
# 0 when haproxy is there, 1 (with the reason) when it cannot be had.
set -euo pipefail
if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "haproxy not installed, and apt-get cannot install it here (needs root and apt-get): apt-get install -y haproxy" >&2
  exit 1
fi
echo "installing haproxy with apt-get..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get install -y -qq haproxy >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq haproxy >/dev/null; }; }; then
  echo "apt-get could not install haproxy" >&2
  exit 1
fi
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]
