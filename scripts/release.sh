#!/usr/bin/env bash
# Reproducible release artifacts: the plugin and `lock` for each platform,
# one tarball each, and SHA256SUMS. The same source, VERSION and
# SOURCE_DATE_EPOCH give the same bytes, wherever the tree is checked out.
#
#   scripts/release.sh VERSION OUTDIR [PLATFORMS]
#
# PLATFORMS defaults to "linux/amd64 linux/arm64". SOURCE_DATE_EPOCH
# defaults to the commit time of HEAD (the tarballs' file times).
set -euo pipefail

version=${1:?usage: scripts/release.sh VERSION OUTDIR [PLATFORMS]}
out=${2:?usage: scripts/release.sh VERSION OUTDIR [PLATFORMS]}
platforms=${3:-linux/amd64 linux/arm64}
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: VERSION=$version is not a semantic version (e.g. 0.2.0 or 0.2.0-rc.1): Nomad refuses plugins whose version it cannot parse" >&2
	exit 64
fi
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH

root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

ldflags="-s -w -buildid= -X github.com/nomad-driver-singleton/nomad-driver-singleton/shim.Version=$version"
# No cgo: static binaries, and no C toolchain in the build's inputs. The
# plugin then resolves task users from /etc/passwd and /etc/group only
# (Go's own os/user), not through NSS (see docs/driver.md, Install).
build() { # goos goarch pkg output
	(cd "$root" && CGO_ENABLED=0 GOOS=$1 GOARCH=$2 GOFLAGS=-mod=readonly \
		go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$4" "$3")
}
# Tarballs with fixed names, order, owners, modes and times; gzip without
# name or time.
pack() { # dir tarball files...
	local dir=$1 tarball=$2
	shift 2
	tar --sort=name --format=gnu --owner=0 --group=0 --numeric-owner \
		--mtime="@$SOURCE_DATE_EPOCH" --mode='go-w,a+rX' \
		-C "$dir" -cf - "$@" | gzip -n -9 >"$tarball"
}

artifacts=()
for p in $platforms; do
	goos=${p%/*} goarch=${p#*/}
	d="$stage/$goos-$goarch"
	mkdir -p "$d/plugin" "$d/lock"
	build "$goos" "$goarch" . "$d/plugin/nomad-driver-singleton"
	build "$goos" "$goarch" ./shim/cmd/lock "$d/lock/lock"
	for kind in plugin lock; do
		cp "$root/LICENSE" "$root/CHANGELOG.md" "$d/$kind/"
	done
	plugin_tgz="nomad-driver-singleton_${version}_${goos}_${goarch}.tar.gz"
	lock_tgz="lock_${version}_${goos}_${goarch}.tar.gz"
	pack "$d/plugin" "$out/$plugin_tgz" nomad-driver-singleton LICENSE CHANGELOG.md
	pack "$d/lock" "$out/$lock_tgz" lock LICENSE CHANGELOG.md
	artifacts+=("$plugin_tgz" "$lock_tgz")
done
(cd "$out" && LC_ALL=C sha256sum $(printf '%s\n' "${artifacts[@]}" | LC_ALL=C sort) >SHA256SUMS)
cat "$out/SHA256SUMS"
