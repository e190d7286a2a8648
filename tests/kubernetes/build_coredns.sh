#!/bin/sh
# Build CoreDNS for the real single-node test cluster, with only the plugins it uses.
#
# usage: build_coredns.sh VERSION DEST
#   VERSION  a github.com/coredns/coredns release on the Go module proxy, e.g. v1.14.7
#   DEST     cache directory; the binary lands in DEST/coredns once it reported its version
#
# The release's own main package compiles in every plugin (the cloud DNS back ends drag in large SDKs).
# CoreDNS supports a smaller build: a main package of one's own that imports coremain and the wanted
# plugins and sets dnsserver.Directives (the order the plugins run in, a subsequence of upstream's).
# The cluster serves cluster.local and the reverse zones from the kubernetes plugin and forwards
# nothing, so no query leaves the machine: there is no forward plugin to configure by mistake.
set -eu

VERSION=$1
DEST=$2
BUILD=$DEST/build

if [ -x "$DEST/coredns" ]; then
	exit 0
fi
mkdir -p "$BUILD"
cd "$BUILD"
GOFLAGS=-mod=mod
export GOFLAGS

cat >go.mod <<MOD
module kubeserve.local/coredns

go 1.25.0

require github.com/coredns/coredns $VERSION
MOD
cat >main.go <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The same relative order as upstream's core/dnsserver/zdirectives.go.
var directives = []string{
	"reload", "bind", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes", "loop",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
GO
go mod tidy
nice -n 10 go build -trimpath -ldflags "-s -w" -o coredns.new .
./coredns.new -version | grep -q "CoreDNS-${VERSION#v}"
mv coredns.new "$DEST/coredns"
