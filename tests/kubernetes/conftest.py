"""Fixtures of the kubernetes test tier: one real single-node cluster per test session.

``node`` (session) is a ``node_cluster.NodeCluster``: etcd and the unpatched control plane with a
real kubelet, containerd, kube-proxy and CoreDNS, whose pods run the kubeserve image (or the tests'
image, the same with ``tests/apps``). It needs root, ``make k8s-node`` and ``KUBESERVE_K8S_NODE=1``
(``make test`` and ``make test-node`` set them); without them the tier is skipped, saying so.
Another test session on this machine holding the node is waited for (see
``node_cluster.start_node_cluster``).

``kwok`` (session) is a ``kwok_cluster.KwokCluster``: the same control plane on 127.0.0.1 with
:data:`KWOK_NODES` fake nodes of kwok instead of the real node (no kubelet, no containers),
even nodes labelled ``pool=a``, odd ones ``pool=b``. ``kwok_pods`` (session) are the stand-ins of
kubeserve's build and replica processes on it (``kwok_pods.PodStandIns``). ``kwok_namespace`` and
``kwok_operator`` are a fresh namespace on it and the operator watching it (as the audited user
``kubeserve-operator``), with the stand-ins running.

``control_plane`` is the same node under the name the operator, admin API, security and install
tests use. ``namespace`` (per test) is a fresh namespace on it, deleted afterwards, so tests
sharing the cluster do not see each other's objects; ``node_namespace`` is the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.common import ROOT
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import OperatorProcess, install_crds
from support.kwok_cluster import KwokCluster, kwok_missing, start_kwok_cluster
from support.kwok_pods import PodStandIns
from support.node_cluster import (
    NODE_IP,
    NodeCluster,
    find_node_bin_dir,
    node_missing,
    start_node_cluster,
)
from support.zip_server import serving, write_zip


@pytest.fixture(scope="session")
def control_plane(node: NodeCluster) -> ControlPlane:
    return node


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    name = control_plane.create_namespace(request.node.name)
    yield name
    control_plane.delete_namespace(name)


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> None:
    install_crds(control_plane)


@pytest.fixture
def operator(
    control_plane: ControlPlane, crds: None, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(control_plane, namespace, tmp_path / "operator.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def node() -> Iterator[NodeCluster]:
    bin_dir = find_node_bin_dir()
    reason = node_missing(bin_dir)
    if reason is not None:
        pytest.skip(reason)
    assert bin_dir is not None
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(start_node_cluster(bin_dir))
        install_crds(cluster)
        yield cluster


@pytest.fixture
def node_namespace(node: NodeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = node.create_namespace(request.node.name)
    yield name
    node.delete_namespace(name)


@pytest.fixture
def node_operator(
    node: NodeCluster, node_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator on the host (its pods are real), watching ``node_namespace``."""
    process = OperatorProcess(node, node_namespace, tmp_path / "operator.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def apps_zip_url(node: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tests/apps`` as a zip archive (one top-level directory) served over HTTP on the node's
    bridge address, for a runtime_env ``working_dir`` that the pods' init container fetches."""
    root = tmp_path_factory.mktemp("apps-zip")
    apps = sorted((ROOT / "tests" / "apps").glob("*.py"))
    write_zip(root / "apps.zip", {f"apps/{path.name}": path for path in apps})
    with serving(root, NODE_IP) as base:
        yield f"{base}apps.zip"


#: The fake nodes of the ``kwok`` cluster.
KWOK_NODES = 10


@pytest.fixture(scope="session")
def kwok() -> Iterator[KwokCluster]:
    reason = kwok_missing()
    if reason is not None:
        pytest.skip(reason)
    with start_kwok_cluster() as cluster:
        install_crds(cluster)
        for pool in ("a", "b") * (KWOK_NODES // 2):
            cluster.add_nodes(1, {"pool": pool})
        yield cluster


@pytest.fixture(scope="session")
def kwok_pods(kwok: KwokCluster) -> Iterator[PodStandIns]:
    with PodStandIns(kwok.kubeconfig) as stand_ins:
        yield stand_ins


@pytest.fixture
def kwok_namespace(kwok: KwokCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = kwok.create_namespace(request.node.name)
    yield name
    kwok.delete_namespace(name)


@pytest.fixture
def kwok_operator(
    kwok: KwokCluster, kwok_pods: PodStandIns, kwok_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        kwok,
        kwok_namespace,
        tmp_path / "operator.log",
        kubeconfig=kwok.operator_kubeconfig,
        host="127.0.0.1",
    )
    process.start()
    yield process
    process.stop()
