"""The operator's choice of node-local sockets for a ServeInstance that leaves
``spec.proxy.nodeLocalSockets`` unset (``DataPlane.node_sockets``), against the real API server
and its Pod Security admission: a server-side dry run of the sockets' pod parts, once per
instance; admitted in a namespace of the default (``privileged``) level, refused under
``baseline`` with the refusal as the reason; no pod is ever created; an answer that says nothing
about admission (the data-plane service account not there yet) is no answer; the spec and the
operator's ``--node-local-sockets off`` decide without asking."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubeserve.backends.kubernetes.data_plane import DataPlane
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Kube, KubeError
from support.k8s_control_plane import ControlPlane


def serve_instance(namespace: str, uid: str, **proxy: Any) -> dict[str, Any]:
    spec = {"proxy": proxy} if proxy else {}
    return {"metadata": {"name": "default", "namespace": namespace, "uid": uid}, "spec": spec}


def test_the_namespace_s_admission_decides_once_per_instance(
    control_plane: ControlPlane, namespace: str
) -> None:
    account = contract.dataplane_account_name("default")
    serving = serve_instance(namespace, "uid-1")

    async def scenario() -> None:
        kube = await Kube.connect(str(control_plane.kubeconfig))
        plane = DataPlane(kube, on_pushed=lambda pod: None)
        try:
            # the probe runs as the data-plane account: before it exists, no answer (retried)
            with pytest.raises(KubeError, match="service account"):
                await plane.node_sockets(serving)
            assert plane.instance_view(serving).node_local_sockets is False
            control_plane.kubectl("create", "serviceaccount", account, "-n", namespace)
            chosen = await plane.node_sockets(serving)
            assert chosen.enabled is True and chosen.reason.startswith("Auto:"), chosen
            assert plane.instance_view(serving).node_local_sockets is True
            writes = kube.counts.writes
            assert await plane.node_sockets(serving) == chosen
            assert kube.counts.writes == writes  # asked once per instance

            # under baseline, hostPath is refused: TCP, in the refusal's words
            control_plane.kubectl(
                "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline"
            )
            recreated = serve_instance(namespace, "uid-2")
            refused = await plane.node_sockets(recreated)
            assert refused.enabled is False, refused
            assert "PodSecurity" in refused.reason and "hostPath" in refused.reason, refused
            assert "node-sockets" in refused.reason, refused  # the volume it names
            assert plane.instance_view(recreated).node_local_sockets is False

            # the spec decides without asking, either way; so does --node-local-sockets off
            writes = kube.counts.writes
            forced = await plane.node_sockets(
                serve_instance(namespace, "uid-3", nodeLocalSockets=True)
            )
            assert forced.enabled is True and "spec.proxy.nodeLocalSockets" in forced.reason
            never = await plane.node_sockets(
                serve_instance(namespace, "uid-4", nodeLocalSockets=False)
            )
            assert never.enabled is False
            off = DataPlane(kube, on_pushed=lambda pod: None, node_sockets_auto=False)
            assert (await off.node_sockets(serve_instance(namespace, "uid-5"))).enabled is False
            assert kube.counts.writes == writes
        finally:
            await kube.close()

    asyncio.run(scenario())
    # dry runs only: no pod was ever created
    assert control_plane.get("pods", namespace=namespace)["items"] == []
