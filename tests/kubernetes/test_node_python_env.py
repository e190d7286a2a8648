"""runtime_env ``pip`` on the real node: the pods' ``runtime-env`` init container installs the
package with the image's uv into the pod's emptyDir, and the build and the replica import it.

The node's pods have no route out, so the index is a directory of wheels served over HTTP on the
bridge address (``--no-index --find-links``, as ``pip_install_options``): what reaches PyPI from
a pod is not tested here (the local tier installs from PyPI itself). The wheel is downloaded on
the host first.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from support.common import ROOT, http, wait_for
from support.k8s_operator import (
    KUBESERVE_IMAGE,
    OperatorProcess,
    application,
    instance,
    proxy_service_url,
    wait_ready,
)
from support.node_cluster import NODE_IP, NodeCluster
from support.zip_server import serving, write_zip

PACKAGE = "inflection==0.5.1"


@pytest.fixture(scope="module")
def wheels_and_app(node: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``<base>/wheels/`` (a flat index) and ``<base>/app.zip`` (``tests/apps``), on the bridge."""
    root = tmp_path_factory.mktemp("pip-index")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(root / "wheels"),
         PACKAGE],
        check=True, timeout=120,
    )  # fmt: skip
    apps = sorted((ROOT / "tests" / "apps").glob("*.py"))
    write_zip(root / "app.zip", {f"apps/{path.name}": path for path in apps})
    with serving(root, NODE_IP) as base:
        yield base


def _app(ns: str, base: str, packages: list[str]) -> dict[str, Any]:
    pip = {
        "packages": packages,
        "pip_install_options": ["--no-index", "--find-links", f"{base}wheels/"],
    }
    runtime_env = {"workingDir": f"{base}app.zip", "pip": pip}
    return application(
        ns, "camel", "ks_inflection_app:app", routePrefix="/camel", runtimeEnv=runtime_env
    )


def test_pip_packages_are_installed_by_the_init_container(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str, wheels_and_app: str
) -> None:
    ns = node_namespace
    node.apply([instance(ns, image=KUBESERVE_IMAGE), _app(ns, wheels_and_app, [PACKAGE])])
    wait_ready(node, node_operator, ns, "camel")
    url = proxy_service_url(node, ns, "/camel")

    def answer() -> dict[str, Any] | None:
        try:
            status, body = http("GET", url)
        except OSError:
            return None
        return body if status == 200 else None

    body = wait_for(answer, 60, what="the app through the Service")
    assert body["camel"] == "HelloWorld"
    assert body["file"].startswith("/var/run/kubeserve/runtime-env/")


def test_an_installer_failure_is_deploy_failed_with_its_tail(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str, wheels_and_app: str
) -> None:
    ns = node_namespace
    app = _app(ns, wheels_and_app, ["kubeserve-no-such-package-a8f3"])
    node.apply([instance(ns, image=KUBESERVE_IMAGE), app])

    def failed() -> dict[str, Any] | None:
        status = node.get("serveapplication", "camel", ns).get("status") or {}
        return status if status.get("appStatus") == "DEPLOY_FAILED" else None

    status = wait_for(failed, 300, interval_s=1, what="camel DEPLOY_FAILED")
    assert "kubeserve-no-such-package-a8f3" in str(status), status
    assert "runtime-env init container exited with code 1" in str(status), status
