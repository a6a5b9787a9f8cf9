#!/usr/bin/env bash
# Makes sure Docker (Debian's docker.io: dockerd, containerd, runc,
# docker-init) and a static busybox (busybox-static) are installed, for the
# docker-driver e2e tests: the harness starts a private dockerd per test
# binary and builds its test image from /bin/busybox, bin/lock and the
# testworkload (e2e/harness/docker.go). It installs them with apt-get when
# missing and we may (root, apt-get present). It never starts or configures
# the system's Docker service. Exits 0 when both are there, 1 (with the
# reason) when they cannot be had.
set -euo pipefail

have_dockerd() { command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ]; }
have_docker_cli() { command -v docker >/dev/null 2>&1 || [ -x /usr/bin/docker ]; }
# The image needs a statically linked busybox: Debian's busybox package is
# dynamic, busybox-static is not (and replaces it).
static_busybox() { [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; }

need=()
{ have_dockerd && have_docker_cli; } || need+=(docker.io)
static_busybox || need+=(busybox-static)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "${need[*]} not installed, and apt-get cannot install it here (needs root and apt-get): apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "installing ${need[*]} with apt-get..." >&2
# docker.io's postinst would start the system dockerd, which (without
# --iptables=false) sets the FORWARD policy to DROP and makes docker0. Deny
# service starts for the install, as Debian's policy-rc.d mechanism allows,
# unless the machine already has a policy of its own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; }; }; then
  echo "apt-get could not install ${need[*]}" >&2
  exit 1
fi
have_dockerd && have_docker_cli && static_busybox
