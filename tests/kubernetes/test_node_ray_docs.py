"""Scripts of Ray's Serve documentation (``tests/drivers/ray_docs/``) run unchanged against the
operator on the real node: ``serve.run`` over its admin API with the caller's Kubernetes token,
``requests`` to ``http://localhost:8000`` reaching the instance's proxy Service (the standard
``http_proxy`` variable points there, as in ``tests/e2e/test_ray_docs_drivers.py``).

The scripts whose driver calls deployments through handles (``model_composition.py``,
``batching.py``, ``driver_api.py``) are not run here: a driver's handle calls go straight to
the replicas over the data plane, authenticated with the instance's data-plane secret, which a
driver outside the cluster does not hold (kubeserve's driver refuses such calls saying so).

Needs the node (``KUBESERVE_K8S_NODE=1``, images from ``make node-images``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.common import wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import AdminApi, OperatorProcess
from support.ray_docs import DOCS, driver_command

#: the scripts whose every request goes over HTTP, and what each prints
HTTP_ONLY = [("getting_started.py", "bon matin"), ("streaming.py", "Client disconnecting")]


def proxy_service(plane: ControlPlane, namespace: str) -> str:
    """The instance's proxy Service, by its ClusterIP (the node routes it for the host)."""
    service = wait_for(
        lambda: (
            plane.exists("service", "default-proxy", namespace)
            and plane.get("service", "default-proxy", namespace)
        ),
        120,
        what="the instance's proxy Service",
    )
    return f"http://{service['spec']['clusterIP']}:8000"


@pytest.mark.parametrize("way", ["compat", "plain"])
def test_documentation_scripts_run_unchanged_against_the_operator(
    control_plane: ControlPlane,
    operator: OperatorProcess,
    namespace: str,
    tmp_path: Path,
    way: str,
) -> None:
    api = AdminApi(operator)
    api.use_tests_image()  # the instance the scripts' serve.run deploys to runs the tests' image
    proxy = proxy_service(control_plane, namespace)
    for script, printed in HTTP_ONLY:
        command, env = driver_command(DOCS / script, way)
        env.update(
            KUBESERVE_ADDRESS=api.url,
            KUBESERVE_AUTH_TOKEN=api.token,
            KUBESERVE_STATE_DIR=str(tmp_path),
            http_proxy=proxy,
            no_proxy="127.0.0.1",
        )
        result = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
        )
        assert result.returncode == 0, f"{script}: {result.stdout}{result.stderr}"
        assert printed in result.stdout, f"{script}: {result.stdout}"
        assert api.details()["applications"]["default"]["status"] == "RUNNING"
