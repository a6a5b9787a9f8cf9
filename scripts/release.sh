#!/usr/bin/env bash
# Reproducible release artifacts for each platform: the plugin and `lock`,
# one tarball each; a .deb and an .rpm holding both (nfpm); an OCI image
# archive holding `lock` alone (go-containerregistry); and SHA256SUMS. The
# packaging tools are pinned in tools/go.mod, apart from the product's
# go.mod. The same source, VERSION and SOURCE_DATE_EPOCH give the same
# bytes, wherever the tree is checked out.
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

# The packaging tools, built once from tools/go.mod.
tools="$stage/tools"
mkdir -p "$tools"
(cd "$root/tools" && GOFLAGS=-mod=readonly go build -trimpath -o "$tools/nfpm" github.com/goreleaser/nfpm/v2/cmd/nfpm &&
	GOFLAGS=-mod=readonly go build -trimpath -o "$tools/ociimage" ./ociimage)
# The plugin links parts of Nomad under the BUSL: its license goes with it.
nomad_license="$(cd "$root" && go list -m -f '{{.Dir}}' github.com/hashicorp/nomad)/LICENSE"

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

	# .deb and .rpm: the plugin into Nomad's default plugin dir, lock into
	# /usr/bin, the plugin block into /etc/nomad.d (scripts/package/nfpm.yaml).
	mkdir -p "$d/pkg"
	cp "$d/plugin/nomad-driver-singleton" "$d/lock/lock" "$root/scripts/package/nomad-driver-singleton.hcl" \
		"$root/LICENSE" "$root/CHANGELOG.md" "$d/pkg/"
	cp "$nomad_license" "$d/pkg/NOMAD-LICENSE"
	for pkg in deb rpm; do
		file="nomad-driver-singleton_${version}_${goos}_${goarch}.$pkg"
		(cd "$d/pkg" && GOARCH=$goarch VERSION=$version \
			"$tools/nfpm" package --config "$root/scripts/package/nfpm.yaml" --packager "$pkg" --target "$out/$file" >/dev/null)
		artifacts+=("$file")
	done

	# The OCI image of lock alone, at /usr/local/bin/lock, its entrypoint.
	mkdir -p "$d/image/usr/local/bin"
	cp "$d/lock/lock" "$d/image/usr/local/bin/lock"
	tar --sort=name --format=gnu --owner=0 --group=0 --numeric-owner \
		--mtime="@$SOURCE_DATE_EPOCH" --mode='go-w,a+rX' -C "$d/image" -cf "$d/layer.tar" usr
	"$tools/ociimage" -layer "$d/layer.tar" -arch "$goarch" -ref "nomad-driver-singleton/lock:$version" \
		-entrypoint /usr/local/bin/lock -version "$version" -out "$d/oci"
	oci="lock_${version}_${goos}_${goarch}.oci.tar"
	(cd "$d/oci" && find . -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +)
	tar --sort=name --format=gnu --owner=0 --group=0 --numeric-owner \
		--mtime="@$SOURCE_DATE_EPOCH" --mode='go-w,a+rX' -C "$d/oci" -cf "$out/$oci" .
	artifacts+=("$oci")
done
(cd "$out" && LC_ALL=C sha256sum $(printf '%s\n' "${artifacts[@]}" | LC_ALL=C sort) >SHA256SUMS)
cat "$out/SHA256SUMS"
