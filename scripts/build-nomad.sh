#!/usr/bin/env bash
# Builds the Nomad agent of another version from the Go module proxy, for
# the compatibility tests (make compat), the way bin/nomad is built from the
# pinned module: in a throw-away module that requires that Nomad and its API
# module at the same commit, with Nomad's own replace directives.
#
#   scripts/build-nomad.sh VERSION OUTPUT     e.g. 1.10.5 bin/nomad-1.10.5
#
# The proxy serves exact versions of github.com/hashicorp/nomad (it lists
# none). A build takes about 10 minutes cold, seconds when OUTPUT is newer
# than this script.
set -euo pipefail
version=${1:?usage: scripts/build-nomad.sh VERSION OUTPUT}
out=${2:?usage: scripts/build-nomad.sh VERSION OUTPUT}
version=${version#v}
if [ -x "$out" ] && [ "$out" -nt "$0" ] && "$out" version 2>/dev/null | grep -qx "Nomad v$version"; then
	exit 0
fi
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
mod=$(mktemp -d)
trap 'rm -rf "$mod"' EXIT
cd "$mod"
go mod init nomad-compat >/dev/null 2>&1
info=$(go mod download -json "github.com/hashicorp/nomad@v$version")
field() { sed -n "s/^[[:space:]]*\"$1\": \"\\(.*\\)\",*\$/\\1/p" <<<"$info" | head -1; }
gomod=$(field GoMod)
hash=$(field Hash)
infofile=$(field Info)
when=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${infofile:-/dev/null}")
if [ -z "$gomod" ] || [ -z "$hash" ] || [ -z "$when" ]; then
	echo "build-nomad: the module proxy did not describe github.com/hashicorp/nomad@v$version:" >&2
	echo "$info" >&2
	exit 1
fi
# The API module at Nomad's own commit: its pseudo-version is the commit's
# time and hash (Nomad's go.mod points it at ./api, which the module lacks).
stamp=$(date -u -d "$when" +%Y%m%d%H%M%S)
api="v0.0.0-$stamp-${hash:0:12}"
{
	echo "module nomad-compat"
	echo
	echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
	echo
	# Nomad's replace directives, but the one of its API module.
	awk '/^replace \($/ {inb=1; print; next} inb && /^\)$/ {inb=0; print; next} inb {print; next}
	     /^replace / && !/=> \.\/api/ {print}' "$gomod"
	echo
	echo "require ("
	echo "	github.com/hashicorp/nomad v$version"
	echo "	github.com/hashicorp/nomad/api $api"
	echo ")"
} >go.mod
echo "build-nomad: building Nomad v$version (api $api) into $out" >&2
GOFLAGS=-mod=mod go build -o "$out" github.com/hashicorp/nomad
"$out" version | head -1
