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
K8S_BIN    := $(K8S_DIR)/bin

.PHONY: run test check format venv ray-client k8s-binaries clean

venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# The real Ray 2.60 `serve` client, in its own virtualenv (cached across clones), for compatibility tests.
ray-client: $(RAY_VENV)/.installed

$(RAY_VENV)/.installed:
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q --upgrade pip
	$(RAY_VENV)/bin/pip install -q 'ray[serve]==2.60.0'
	touch $@

## Control-plane binaries for the kubernetes test tier (kube-apiserver, kube-controller-manager,
## kube-scheduler, kubectl built from k8s.io/kubernetes at $(K8S_VERSION), cached across clones) and etcd.
## A cold build takes several minutes; afterwards the stamp file makes this a no-op.
k8s-binaries: $(K8S_BIN)/.stamp
	@command -v etcd >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; }

$(K8S_BIN)/.stamp:
	sh tests/kubernetes/build_k8s_binaries.sh $(K8S_VERSION) $(K8S_DIR)

## Start kubeserve on this machine with the example applications (admin API :8265, HTTP :8000).
run: venv
	$(BIN)/kubeserve start --state-dir $(STATE_DIR) --deploy examples/config.yaml

## Run every test: unit, API over HTTP, end to end with real processes, the Ray 2.60 client.
test: venv ray-client k8s-binaries
	KUBESERVE_RAY_SERVE=$(RAY_SERVE) KUBESERVE_K8S_BIN=$(K8S_BIN) $(BIN)/python -m pytest $(PYTEST_ARGS)

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
	$(BIN)/python -m kubeserve.schema.crd --out crds
