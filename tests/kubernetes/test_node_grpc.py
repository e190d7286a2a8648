"""The gRPC proxy on a real node: a ServeInstance with ``grpcOptions`` gets a proxy pod serving
gRPC and a ``grpc`` port on its Service; a grpcio client reaches the application's replica pod
through the Service's ClusterIP (kube-proxy), with the servicer modules imported from the tests'
image (where the proxy must find them, as in Ray); client streams and server reflection too."""

from __future__ import annotations

import importlib
from typing import Any

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from support.common import wait_for
from support.grpc_protos import ensure_generated
from support.k8s_operator import (
    SMALL_REPLICA,
    OperatorProcess,
    application,
    instance,
    wait_ready,
)
from support.node_cluster import NodeCluster

GRPC_PORT = 9000


def test_grpc_through_the_proxy_service(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ensure_generated()
    ns = node_namespace
    serving = instance(ns)
    serving["spec"]["grpcOptions"] = {
        "port": GRPC_PORT,
        "grpcServicerFunctions": ["ks_grpc_checks_pb2_grpc.add_ChecksServicer_to_server"],
    }
    checks = application(
        ns,
        "checks",
        "ks_grpc_checks_app:app",
        routePrefix="/checks",
        deployments=[{"name": "Checks", **SMALL_REPLICA}],
    )
    node.apply([serving, checks])
    wait_ready(node, node_operator, ns, "checks")
    service = node.get("service", "default-proxy", ns)
    ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    assert ports["grpc"] == GRPC_PORT
    pb2: Any = importlib.import_module("ks_grpc_checks_pb2")
    stubs: Any = importlib.import_module("ks_grpc_checks_pb2_grpc")
    target = f"{service['spec']['clusterIP']}:{GRPC_PORT}"
    metadata = (("application", "checks"), ("request_id", "node-1"))
    with grpc.insecure_channel(target) as channel:
        stub = stubs.ChecksStub(channel)

        def echoed() -> Any:
            try:
                return stub.Echo(pb2.Ask(text="node"), metadata=metadata, timeout=5)
            except grpc.RpcError:
                return None

        answer = wait_for(echoed, 60, interval_s=1, what="a gRPC answer through the Service")
        assert answer.text == "node|app=checks|rid=node-1"
        streamed = [a.index for a in stub.Count(pb2.Ask(text="n", count=4), metadata=metadata)]
        assert streamed == [0, 1, 2, 3]
        asks = iter([pb2.Ask(text="a"), pb2.Ask(text="b")])
        assert stub.Upload(asks, metadata=metadata, timeout=10).text == "a+b"
        chat = stub.Chat(iter([pb2.Ask(text="x", count=7)]), metadata=metadata, timeout=10)
        assert [(a.text, a.index) for a in chat] == [("re:x", 7)]
        # reflection is on by default (grpc_options.enable_reflection), as in Ray
        assert "ksgrpc.Checks" in ProtoReflectionDescriptorDatabase(channel).get_services()
        try:
            stub.RaiseWithCode(pb2.Ask(text="k8s"), metadata=metadata, timeout=10)
            raise AssertionError("RaiseWithCode answered")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
