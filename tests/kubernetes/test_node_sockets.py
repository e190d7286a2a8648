"""``ServeInstance.spec.proxy.nodeLocalSockets`` on the real node: turned on for a running
instance that had it off (whose proxy pod reached its replica over TCP), the pods roll; the
replica pod listens on a unix socket in the node's directory of the instance, the proxy pod
(native data path) reaches it there and no longer over TCP across the bridge, every request is
answered, and a replica pod that leaves removes its socket while its replacement serves on its
own. In a namespace whose Pod Security refuses hostPath, the application's status says so; left
unset there, the operator's choice is TCP and the application serves (the status says why)."""

from __future__ import annotations

import concurrent.futures
import importlib
import ipaddress
import os
import stat
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubeserve.runtime.kubernetes import contract
from support.common import ROOT, http, wait_for
from support.k8s_operator import OperatorProcess, application, instance, ready_pods
from support.node_cluster import NodeCluster


@pytest.fixture
def row(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``benchmarks/kubernetes_row.py``, whose ``deploy`` the bench's node-local sockets row
    uses (its directory on the path, for the modules it imports)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("kubernetes_row")


def connections(replica_pid: int, proxy_pid: int, socket_path: str, peer: str) -> tuple[int, int]:
    """(Unix connections accepted on the replica's ``socket_path``, established TCP connections
    from ``peer`` to the replica port). An accepted unix socket belongs to the network namespace
    of the caller that connected (the proxy pod's), where it shows the listener's path; TCP is
    read in the replica pod's."""
    unix = 0
    for line in Path(f"/proc/{proxy_pid}/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        # Num RefCount Protocol Flags Type St Inode Path: St 03 is a connected socket
        if len(fields) == 8 and fields[7] == socket_path and fields[5] == "03":
            unix += 1
    tcp = 0
    for line in Path(f"/proc/{replica_pid}/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        port = int(local.split(":")[1], 16)
        remote_ip = str(ipaddress.IPv4Address(int(remote.split(":")[0], 16).to_bytes(4, "little")))
        if state == "01" and port == contract.REPLICA_PORT and remote_ip == peer:
            tcp += 1
    return unix, tcp


def get_all(url: str, count: int) -> list[Any]:
    """``count`` GETs, 8 at a time: the failures (status and body, or the error)."""

    def one(_: int) -> Any:
        try:
            status, body = http("GET", url, timeout=10)
        except OSError as exc:
            return repr(exc)
        return None if (status, body) == (200, "ok") else (status, body)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return [f for f in pool.map(one, range(count)) if f is not None]


def under_load(url: str, pids: tuple[int, int], name: str, proxy_ip: str) -> tuple[int, int]:
    """400 requests through the proxy, every one answered; meanwhile, the most connections the
    replica (``pids``: its process and the proxy's) held at once from the proxy: (over its
    socket, over TCP)."""
    most = [0, 0]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        failures = pool.submit(get_all, url, 400)
        while not failures.done():
            seen = connections(*pids, f"{contract.NODE_SOCKETS_DIR}/{name}", proxy_ip)
            most = [max(m, n) for m, n in zip(most, seen, strict=True)]
            time.sleep(0.01)
        assert failures.result() == []
    return most[0], most[1]


def test_the_proxy_reaches_a_replica_on_its_node_through_the_nodes_socket(
    node: NodeCluster, node_namespace: str, node_operator: OperatorProcess, row: ModuleType
) -> None:
    # Turned off: TCP from the proxy pod to the replica pod, no socket (what the measure below
    # tells apart)
    before = row.deploy(node, node_operator, node_namespace, node_sockets=False)
    url = f"http://{before['proxy']['status']['podIP']}:{row.PORT}{row.ROUTE}"
    pids = (row.pod_pids(before["replica"])[0], row.pod_pids(before["proxy"])[0])
    tcp_name = f"{before['replica']['status']['podIP']}-{contract.REPLICA_PORT}.sock"
    unix, tcp = under_load(url, pids, tcp_name, before["proxy"]["status"]["podIP"])
    assert unix == 0 and tcp >= 1, (unix, tcp)
    # Turned on for the running instance: its proxy and replica pods roll
    node.kubectl(
        "patch", "serveinstance", contract.DEFAULT_INSTANCE, "-n", node_namespace,
        "--type=merge", "-p", '{"spec": {"proxy": {"nodeLocalSockets": true}}}',
    )  # fmt: skip
    old = {before[c]["metadata"]["uid"] for c in ("proxy", "replica")}

    def rolled() -> dict[str, dict[str, Any]] | None:
        found = {}
        for component in ("proxy", "replica"):
            pods = ready_pods(node, node_namespace, f"app.kubernetes.io/component={component}")
            if len(pods) != 1 or pods[0]["metadata"]["uid"] in old:
                return None
            found[component] = pods[0]
        return found

    pods = wait_for(rolled, 180, what="the proxy and replica pods rolled")
    proxy, replica = pods["proxy"], pods["replica"]
    directory = Path(contract.node_sockets_host_path(node_namespace, contract.DEFAULT_INSTANCE))
    # the node's directory belongs to the pods' user alone (the replica pod's init container)
    info = directory.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (10001, 10001, 0o700)
    replica_ip, proxy_ip = replica["status"]["podIP"], proxy["status"]["podIP"]
    name = f"{replica_ip}-{contract.REPLICA_PORT}.sock"
    assert stat.S_ISSOCK((directory / name).lstat().st_mode)
    url = f"http://{proxy_ip}:{row.PORT}{row.ROUTE}"
    proxy_pid = row.pod_pids(proxy)[0]
    unix, tcp = under_load(url, (row.pod_pids(replica)[0], proxy_pid), name, proxy_ip)
    assert unix >= 1 and tcp == 0, (unix, tcp)

    # The replica pod leaves (deleted: SIGTERM) and is replaced: its socket goes with it, and
    # the replacement serves on its own.
    node.kubectl("delete", "pod", replica["metadata"]["name"], "-n", node_namespace, timeout=120)

    def replaced() -> dict[str, Any] | None:
        found = ready_pods(node, node_namespace, "app.kubernetes.io/component=replica")
        others = [p for p in found if p["metadata"]["uid"] != replica["metadata"]["uid"]]
        return others[0] if others else None

    new = wait_for(replaced, 180, what="a replacement replica pod")
    assert not (directory / name).exists()
    new_name = f"{new['status']['podIP']}-{contract.REPLICA_PORT}.sock"
    wait_for(lambda: (directory / new_name).exists(), 60, what=f"{new_name}")
    wait_for(lambda: not get_all(url, 8), 60, what="the replacement to serve")
    unix, tcp = under_load(url, (row.pod_pids(new)[0], proxy_pid), new_name, proxy_ip)
    assert unix >= 1 and tcp == 0, (unix, tcp)
    assert sorted(os.listdir(directory)) == [new_name]


def test_a_namespace_whose_pod_security_refuses_the_sockets_says_so(
    node: NodeCluster, node_namespace: str, node_operator: OperatorProcess
) -> None:
    """Under the ``baseline`` Pod Security level (no hostPath), the replica pods are refused by
    the API server: the application's status says why, in the words of the refusal."""
    node.kubectl(
        "label", "namespace", node_namespace, "pod-security.kubernetes.io/enforce=baseline"
    )
    serving = instance(node_namespace)
    serving["spec"]["proxy"] = {"nodeLocalSockets": True}
    node.apply(serving)
    node.apply(
        application(
            node_namespace, "refused", "apps:noop", routePrefix="/noop",
            deployments=[{"name": "Noop", "numReplicas": 1}],
        )
    )  # fmt: skip

    def said() -> str | None:
        status = node.get("serveapplication", "refused", node_namespace).get("status") or {}
        deployments = (status.get("deployments") or {}).values()
        messages = [str(d.get("message", "")) for d in deployments]
        return next((m for m in messages if "pods cannot be created" in m), None)

    message = wait_for(said, 120, what="the refusal in the application's status")
    assert "PodSecurity" in message and "hostPath" in message, message
    assert "node-sockets" in message, message  # the volume the refusal names


def test_left_unset_in_such_a_namespace_the_operator_chooses_tcp_and_serves(
    node: NodeCluster, node_namespace: str, node_operator: OperatorProcess, row: ModuleType
) -> None:
    """``nodeLocalSockets`` unset (the operator's ``Auto``) under ``baseline``: the dry run is
    refused, so the pods are rendered without the node's directory, are admitted and serve; the
    instance's status says TCP and quotes the refusal. In a namespace of the default level the
    same instance gets the sockets (every other node test runs so)."""
    node.kubectl(
        "label", "namespace", node_namespace, "pod-security.kubernetes.io/enforce=baseline"
    )
    pods = row.deploy(node, node_operator, node_namespace)
    for component in ("proxy", "replica"):
        spec = pods[component]["spec"]
        assert not [v for v in spec["volumes"] if "hostPath" in v], component
        assert [c["name"] for c in spec.get("initContainers", [])] == [], component
    url = f"http://{pods['proxy']['status']['podIP']}:{row.PORT}{row.ROUTE}"
    assert get_all(url, 16) == []
    status = node.get("serveinstance", contract.DEFAULT_INSTANCE, node_namespace)["status"]
    chosen = status["nodeLocalSockets"]
    assert chosen["enabled"] is False, chosen
    assert chosen["reason"].startswith("Auto: TCP") and "PodSecurity" in chosen["reason"], chosen
