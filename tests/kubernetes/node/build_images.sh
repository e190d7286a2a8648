#!/bin/sh
# Build the container images of the real single-node test cluster, with no registry, and cache them.
#
# usage: build_images.sh CACHE REPO
#   CACHE  cache directory (~/.cache/kubeserve/node/images); archives land here
#   REPO   the kubeserve checkout whose Dockerfile builds the kubeserve image
#
# The images, docker-archives (but the base) that `ctr -n k8s.io images import` loads into the node's containerd:
#   pause.tar           kubeserve.local/pause:3.10: one static binary (node/pause.c), the pod sandbox
#   (no archive)        kubeserve.local/debian-python:bookworm: debootstrap's Debian with python3 and
#                       pip, in buildah's storage only: the base the kubeserve image builds FROM
#   kubeserve-KEY.tar   docker.io/library/kubeserve:0.1.0 (what the chart and the operator name by
#                       default), built by buildah from the repository's Dockerfile; KEY hashes what the
#                       Dockerfile copies plus the base image, so a change to the package rebuilds it
#                       and nothing else does. kubeserve.tar links to the newest one. The native
#                       data path's binary is not compiled in the image (no Rust image to pull):
#                       `make native` builds REPO/native/target/release/kubeserve-fastpath on this
#                       (bookworm) host and the Dockerfile copies it (FASTPATH_PREBUILT); KEY covers
#                       native/'s sources and that binary.
#   kubeserve-tests-KEY.tar  docker.io/library/kubeserve-tests:0.1.0: the kubeserve image with the test
#                       applications (tests/apps/*.py) and the benchmark's (benchmarks/apps.py) in
#                       /app, so `importPath: e2e_probe:app` works in the tests' pods; KEY covers the
#                       kubeserve image, those files and TEST_APP_REQUIREMENTS (what the apps import:
#                       FastAPI and Starlette, pip-installed as a user's image would).
#                       kubeserve-tests.tar links to the newest one.
#   wrk.tar             kubeserve.local/wrk:bookworm: the base with Debian's wrk, the load generator
#                       `make bench-kubernetes` runs in a pod next to the pods it loads (built once).
# buildah runs with vfs storage and chroot isolation (no fuse-overlayfs, no user namespaces), its store
# under CACHE/buildah. RUN steps reach PyPI through the host's CA bundle, mounted read-only.
set -eu

CACHE=$1
REPO=$(cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
PAUSE=kubeserve.local/pause:3.10
BASE=kubeserve.local/debian-python:bookworm
IMAGE=docker.io/library/kubeserve:0.1.0
TESTS_IMAGE=docker.io/library/kubeserve-tests:0.1.0
WRK=kubeserve.local/wrk:bookworm
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# the native data path's binary, relative to REPO (`make native`)
FASTPATH=native/target/release/kubeserve-fastpath
# the replica's compiled extension, kubeserve._native (`make native` too)
NATIVE_EXT=native/pyext/target/release/lib_native.so

mkdir -p "$CACHE/buildah/run"
buildah() {
	nice -n 10 /usr/bin/buildah --root "$CACHE/buildah/storage" --runroot "$CACHE/buildah/run" \
		--storage-driver vfs "$@"
}
export BUILDAH_ISOLATION=chroot

has_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

build_pause() {
	[ -f "$CACHE/pause.tar" ] && return 0
	work=$(mktemp -d)
	gcc -static -Os -s -o "$work/pause" "$HERE/pause.c"
	printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$work/Containerfile"
	buildah bud --quiet --pull=never -f "$work/Containerfile" -t "$PAUSE" "$work"
	rm -f "$CACHE/pause.tar.new"
	buildah push --quiet "$PAUSE" "docker-archive:$CACHE/pause.tar.new:$PAUSE"
	mv "$CACHE/pause.tar.new" "$CACHE/pause.tar"
	rm -rf "$work"
}

build_base() {
	has_image "$BASE" && return 0
	rootfs=$CACHE/base-rootfs
	if [ ! -f "$rootfs/.complete" ]; then
		rm -rf "$rootfs"
		nice -n 10 debootstrap --variant=minbase --include=python3,python3-pip,python3-venv \
			bookworm "$rootfs" http://deb.debian.org/debian
		touch "$rootfs/.complete"
	fi
	work=$(mktemp -d)
	# Like python:3.11-slim: pip may install into the system Python, `python` is python3, no apt lists.
	tar -C "$rootfs" --exclude=./.complete --exclude=./var/lib/apt/lists/* --exclude=./var/cache/apt/* \
		--exclude=./usr/lib/python3.11/EXTERNALLY-MANAGED -cf "$work/rootfs.tar" .
	printf 'FROM scratch\nADD rootfs.tar /\nRUN ln -sf /usr/bin/python3 /usr/local/bin/python\nCMD ["python3"]\n' \
		>"$work/Containerfile"
	buildah bud --quiet --pull=never -f "$work/Containerfile" -t "$BASE" "$work"
	rm -rf "$work"
}

image_key() {
	base_id=$(buildah inspect --type image --format '{{.FromImageID}}' "$BASE")
	cd "$REPO"
	{
		echo "$base_id"
		cat Dockerfile .dockerignore
		find pyproject.toml README.md operator examples native -path native/target -prune \
			-o -path native/pyext/target -prune -o -name '_native.abi3.so' -o -type f \
			! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print |
			LC_ALL=C sort | xargs sha256sum
		sha256sum "$FASTPATH" "$NATIVE_EXT"
	} | sha256sum | cut -c1-16
}

build_kubeserve() {
	for built in "$FASTPATH" "$NATIVE_EXT"; do
		if [ ! -f "$REPO/$built" ]; then
			echo "build_images.sh: no $REPO/$built: run \`make native\` first" >&2
			exit 1
		fi
	done
	key=$(image_key)
	archive=$CACHE/kubeserve-$key.tar
	if [ ! -f "$archive" ]; then
		buildah bud --quiet --pull=never --layers=false --build-arg "BASE_IMAGE=$BASE" \
			--build-arg "NATIVE_IMAGE=$BASE" --build-arg "FASTPATH_PREBUILT=$FASTPATH" \
			--build-arg "NATIVE_EXT_PREBUILT=$NATIVE_EXT" \
			--volume "$CA_BUNDLE:$CA_BUNDLE:ro" -t "$IMAGE" "$REPO"
		rm -f "$archive.new"
		buildah push --quiet "$IMAGE" "docker-archive:$archive.new:$IMAGE"
		mv "$archive.new" "$archive"
		# vfs keeps a full copy of the file system per layer: keep only the base between builds.
		buildah rmi "$IMAGE" >/dev/null
		buildah rmi --prune >/dev/null 2>&1 || true
	fi
	for old in "$CACHE"/kubeserve-[0-9a-f]*.tar; do
		[ "$old" = "$archive" ] || rm -f "$old"
	done
	ln -sf "$(basename "$archive")" "$CACHE/kubeserve.tar"
}

# save_container CONTAINER IMAGE ARCHIVE: commit the working container as IMAGE, write it to the
# docker-archive ARCHIVE (whole or not at all), and drop both from buildah's store (vfs keeps a full
# copy of the file system per layer).
save_container() {
	buildah commit --quiet "$1" "$2" >/dev/null
	buildah rm "$1" >/dev/null
	rm -f "$3.new"
	buildah push --quiet "$2" "docker-archive:$3.new:$2"
	mv "$3.new" "$3"
	buildah rmi "$2" >/dev/null
	buildah rmi --prune >/dev/null 2>&1 || true
}

# What the test applications import besides kubeserve, installed as a user's image FROM kubeserve
# installs its application's requirements (Ray's FastAPI and Starlette examples need them).
TEST_APP_REQUIREMENTS="fastapi starlette python-multipart"

build_tests_image() {
	key=$(
		{
			readlink "$CACHE/kubeserve.tar"
			echo "$TEST_APP_REQUIREMENTS"
			cd "$REPO" && { find tests/apps -maxdepth 1 -name '*.py'; echo benchmarks/apps.py; } |
				LC_ALL=C sort | xargs sha256sum
		} | sha256sum | cut -c1-16
	)
	archive=$CACHE/kubeserve-tests-$key.tar
	if [ ! -f "$archive" ]; then
		work=$(mktemp -d)
		cp "$REPO"/tests/apps/*.py "$REPO"/benchmarks/apps.py "$work/"
		container=$(buildah from --quiet "docker-archive:$CACHE/kubeserve.tar")
		# shellcheck disable=SC2086 # a list of requirements
		buildah run --user 0:0 --volume "$CA_BUNDLE:$CA_BUNDLE:ro" "$container" -- \
			pip install --quiet $TEST_APP_REQUIREMENTS
		buildah copy --quiet --chown 10001:10001 "$container" "$work" /app/ >/dev/null
		save_container "$container" "$TESTS_IMAGE" "$archive"
		rm -rf "$work"
	fi
	for old in "$CACHE"/kubeserve-tests-*.tar; do
		[ "$old" = "$archive" ] || rm -f "$old"
	done
	ln -sf "$(basename "$archive")" "$CACHE/kubeserve-tests.tar"
}

# The base plus Debian's wrk: apt lists are left out of the base, so the RUN fetches them first.
build_wrk() {
	[ -f "$CACHE/wrk.tar" ] && return 0
	container=$(buildah from --quiet --pull=never "$BASE")
	buildah run --user 0:0 "$container" -- sh -c \
		'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends wrk &&
		 rm -rf /var/lib/apt/lists/* /var/cache/apt/*'
	save_container "$container" "$WRK" "$CACHE/wrk.tar"
}

build_pause
build_base
build_kubeserve
build_tests_image
build_wrk
