"""The native data path on a real node: ``ServeInstance.spec.proxy.dataPath: native`` runs the
proxy pods with ``--data-path native``, an instance that does not choose runs them with the
proxy's own default (native), and in both the ``kubeserve-fastpath`` the image ships answers the
requests sent through the proxy Service (its own counters, read from its control socket inside
the pod, grow by every request sent). The API server refuses a data path that is not one, naming
the field."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import yaml

from support.common import wait_for
from support.k8s_operator import (
    KUBESERVE_IMAGE,
    OperatorProcess,
    application,
    instance,
    proxy_service_url,
    wait_ready,
)
from support.node_cluster import NodeCluster

PROXIES = "app.kubernetes.io/component=proxy"
REQUESTS = 50

#: Run in the proxy pod (as the proxy's user): the kubeserve-fastpath processes, and the stats its
#: control socket answers (the Python proxy's own connection to it stays untouched: it accepts
#: any number).
_NATIVE_STATS = """
import glob, json, os, socket, tempfile
pids = []
for exe in glob.glob("/proc/[0-9]*/exe"):
    try:
        if os.readlink(exe).endswith("/kubeserve-fastpath"):
            pids.append(int(exe.split("/")[2]))
    except OSError:
        pass
(path,) = glob.glob(os.path.join(tempfile.gettempdir(), "kubeserve-fastpath-*", "control.sock"))
with socket.socket(socket.AF_UNIX) as sock:
    sock.connect(path)
    sock.sendall(b'{"op": "stats"}\\n')
    stats = json.loads(sock.makefile().readline())
print(json.dumps({"pids": pids, "stats": stats}))
"""


def native_instance(ns: str, **proxy: Any) -> dict[str, Any]:
    serving = instance(ns, image=KUBESERVE_IMAGE)
    if proxy:
        serving["spec"]["proxy"] = proxy
    return serving


def proxy_pod(node: NodeCluster, ns: str) -> dict[str, Any]:
    pods = node.get("pods", namespace=ns, selector=PROXIES)["items"]
    (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return dict(pod)


def native_state(node: NodeCluster, ns: str, pod: str) -> dict[str, Any]:
    answer = node.kubectl("exec", pod, "-n", ns, "--", "python3", "-c", _NATIVE_STATS)
    state: dict[str, Any] = json.loads(answer.stdout)
    return state


def answered_ok(state: dict[str, Any]) -> int:
    """Requests the native process answered 200 itself, every deployment together."""
    return sum(int(by_status.get("200", 0)) for by_status in state["stats"]["answered"].values())


def keep_alive_gets(url: str, count: int) -> list[str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    bodies = []
    try:
        for _ in range(count):
            conn.request("GET", parts.path)
            response = conn.getresponse()
            assert response.status == 200, response.status
            assert response.getheader("x-request-id")
            bodies.append(response.read().decode())
    finally:
        conn.close()
    return bodies


def test_native_data_path_serves_through_the_proxy_service(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    command = serve_natively(node, node_operator, node_namespace, dataPath="native")
    assert command[command.index("--data-path") + 1] == "native"


def test_the_default_data_path_is_native(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """An instance that does not choose (the operator's default): no flag, the proxy's own
    default, and the image's kubeserve-fastpath serves."""
    command = serve_natively(node, node_operator, node_namespace)
    assert "--data-path" not in command


def serve_natively(
    node: NodeCluster, node_operator: OperatorProcess, ns: str, **proxy: Any
) -> list[str]:
    """Deploy hello on an instance with ``spec.proxy`` = ``proxy``, send requests through the
    proxy Service, check the native process answered them; returns the proxy's command."""
    node.apply(
        [
            native_instance(ns, **proxy),
            application(ns, "hello", "examples.hello:app", routePrefix="/hello"),
        ]
    )
    wait_ready(node, node_operator, ns, "hello")
    url = proxy_service_url(node, ns, "/hello")
    pod = proxy_pod(node, ns)
    (container,) = pod["spec"]["containers"]
    command: list[str] = container["command"]
    name = pod["metadata"]["name"]
    before = native_state(node, ns, name)
    assert before["pids"], "the proxy pod runs no kubeserve-fastpath"

    bodies = keep_alive_gets(url, REQUESTS)
    assert len(set(bodies)) == 1 and bodies[0]

    def counted() -> dict[str, Any] | None:
        state = native_state(node, ns, name)
        return state if answered_ok(state) - answered_ok(before) >= REQUESTS else None

    after = wait_for(counted, 30, interval_s=1, what="the native process counting the requests")
    assert after["pids"] == before["pids"]  # the same process served them all
    print(f"native answered {answered_ok(after) - answered_ok(before)} of {REQUESTS} requests")
    return command


def refusal(node: NodeCluster, obj: dict[str, Any]) -> str:
    obj["metadata"]["name"] = "refused"
    answer = node.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert answer.returncode != 0, f"the API server accepted {obj['spec']}"
    return answer.stderr


def test_the_api_server_refuses_a_bad_data_path(node: NodeCluster, node_namespace: str) -> None:
    ns = node_namespace
    unknown = refusal(node, native_instance(ns, dataPath="turbo"))
    assert "spec.proxy.dataPath" in unknown and "turbo" in unknown, unknown
    assert node.kubectl("get", "serveinstance", "refused", "-n", ns, check=False).returncode != 0
