"""HTTPS on a real node: ``ServeInstance.spec.tls`` names a Secret shaped as cert-manager writes
it (``tls.crt``, ``tls.key``, ``ca.crt``); the proxy pods mount it and serve HTTPS through the
proxy Service's ClusterIP, to clients that verify the certificate against the CA.

A renewal (the Secret updated with a new certificate) under steady keep-alive load fails no
request, and new handshakes present the new certificate once the kubelet has delivered it. A
Secret the proxies could not serve (no ``tls.key``, a key that is not the certificate's, an
expired certificate) puts ``InvalidTLS`` with the cause in the instance's status; no proxy starts
on it, and a proxy already serving keeps serving its previous certificate. With
``requireClientCertificates`` a client without a certificate the Secret's CA signed fails the
handshake.
"""

from __future__ import annotations

import collections
import http.client
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

from support.common import wait_for
from support.k8s_operator import OperatorProcess, wait_ready
from support.load import Load, TLSClient, failures
from support.node_cluster import NodeCluster
from support.node_recorder import recorder, settled
from support.tls_certs import Authority, Pair, cert_manager_files, tls_secret

PORT = 8000
SECRET = "proxy-cert"
PROXIES = "app.kubernetes.io/component=proxy"
#: the kubelet's Secret-volume sync (its syncFrequency on this node is 10 s, plus jitter and the
#: proxy's 2 s poll); generous for a busy machine
DELIVERY_S = 150
#: longer than the proxy's liveness probe takes to fail (3 failures 10 s apart) and restart it
LIVENESS_KILL_S = 50


def serving_name(ns: str) -> str:
    """The proxy Service's DNS name: what the certificates are issued for."""
    return f"default-proxy.{ns}.svc"


def client(authority: Authority, ns: str, certificate: Pair | None = None) -> TLSClient:
    context = ssl.create_default_context(cafile=str(authority.path))
    if certificate is not None:
        context.load_cert_chain(certificate.cert, certificate.key)
    return TLSClient(context, serving_name(ns))


def get(tls: TLSClient, host: str) -> tuple[int, bytes, bytes]:
    """``GET /`` on a new connection (a new handshake): status, body and the DER certificate the
    server presented."""
    conn = tls.connection(host, PORT, timeout=10)
    try:
        conn.request("GET", "/", headers={"X-Request-Id": "tls-probe"})
        response = conn.getresponse()
        assert conn.sock is not None
        presented = conn.sock.getpeercert(binary_form=True) or b""
        return response.status, response.read(), presented
    finally:
        conn.close()


def der(pair: Pair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


def presents(tls: TLSClient, host: str, pair: Pair) -> bool:
    """A new handshake presents ``pair``'s certificate and the request is answered 200."""
    try:
        status, _, presented = get(tls, host)
    except (OSError, http.client.HTTPException):
        return False
    return status == 200 and presented == der(pair)


def instance_condition(node: NodeCluster, ns: str) -> dict[str, Any]:
    status = node.get("serveinstance", "default", ns).get("status") or {}
    conditions = status.get("conditions") or [{}]
    condition: dict[str, Any] = conditions[0]
    return condition


def invalid_tls(node: NodeCluster, ns: str, cause: str) -> dict[str, Any]:
    """Wait for the instance's ``Ready`` condition to say ``InvalidTLS`` naming ``cause``."""

    def shown() -> dict[str, Any] | None:
        condition = instance_condition(node, ns)
        found = condition.get("reason") == "InvalidTLS" and cause in condition.get("message", "")
        return condition if found else None

    return wait_for(shown, 90, interval_s=1, what=f"InvalidTLS naming {cause!r}")


def running_again(node: NodeCluster, ns: str) -> None:
    wait_for(
        lambda: instance_condition(node, ns).get("status") == "True",
        90,
        interval_s=1,
        what="the instance Ready again",
    )


def proxy_pods(node: NodeCluster, ns: str) -> dict[str, int]:
    """Proxy pod name -> restarts of its container, of the pods not being deleted (a deleted
    proxy serves on while it leaves: see ``LeavePlan``)."""
    pods = node.get("pods", namespace=ns, selector=PROXIES)["items"]
    return {
        p["metadata"]["name"]: sum(
            c["restartCount"] for c in p["status"].get("containerStatuses", [])
        )
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def delivered(node: NodeCluster, ns: str, pod: str, key: str, pem: Path) -> bool:
    """The kubelet has written ``pem`` as ``key`` of the Secret volume in ``pod``."""
    command = ["exec", pod, "-n", ns, "--", "cat", f"/etc/kubeserve/tls/{key}"]
    return node.kubectl(*command, check=False).stdout == pem.read_text()


def with_tls(objects: list[dict[str, Any]], **tls: Any) -> list[dict[str, Any]]:
    objects[0]["spec"]["tls"] = {"secretName": SECRET, **tls}
    return objects


def cluster_ip(node: NodeCluster, ns: str) -> str:
    ip: str = node.get("service", "default-proxy", ns)["spec"]["clusterIP"]
    return ip


def refused(node: NodeCluster, ns: str, proxy: str, files: dict[str, Path], cause: str) -> None:
    """Update the Secret with ``files`` the proxies could not serve: the instance's status says
    ``InvalidTLS`` naming ``cause``, and the proxy pod ``proxy``, once the kubelet delivered the
    files, logs that they do not load."""
    refusals = node.pod_log(ns, proxy).count("do not load")
    applied = time.monotonic()
    node.apply(tls_secret(ns, SECRET, files))
    condition = invalid_tls(node, ns, cause)
    print(f"InvalidTLS ({cause}) {time.monotonic() - applied:.1f} s after the Secret update")
    assert condition["status"] == "False"
    assert condition["message"].startswith(f"spec.tls.secretName '{SECRET}': ")
    wait_for(lambda: delivered(node, ns, proxy, "tls.crt", files["tls.crt"]),
             DELIVERY_S, interval_s=2, what="the bad Secret in the proxy pod")  # fmt: skip
    wait_for(lambda: node.pod_log(ns, proxy).count("do not load") > refusals, 10,
             interval_s=0.5, what="the proxy refusing the bad files")  # fmt: skip


def test_https_through_the_proxy_service_a_renewal_under_load_and_bad_secrets(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str, tmp_path: Path
) -> None:
    ns = node_namespace
    ca = Authority(tmp_path)
    hosts = (serving_name(ns),)
    first = ca.issue("first", hosts=hosts)
    node.apply([tls_secret(ns, SECRET, cert_manager_files(ca, first)), *with_tls(recorder(ns, 1))])
    wait_ready(node, node_operator, ns, "faults")
    wait_for(lambda: settled(node, ns, 1, set()), 120, what="the replica Ready")
    ip, tls = cluster_ip(node, ns), client(ca, ns)
    wait_for(lambda: presents(tls, ip, first), 60, interval_s=1, what="HTTPS through the Service")
    running_again(node, ns)

    # a real client: curl, verifying the CA, the name resolved to the ClusterIP
    name = serving_name(ns)
    curl = ["curl", "-sS", "--fail", "--cacert", str(ca.path), "--resolve", f"{name}:{PORT}:{ip}"]
    answer = subprocess.run([*curl, "-H", "X-Request-Id: by-curl", f"https://{name}:{PORT}/"],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert (answer.returncode, answer.stdout) == (0, "by-curl"), answer.stderr
    stranger = client(Authority(tmp_path / "other", "another CA"), ns)
    try:
        get(stranger, ip)
        raise AssertionError("a CA that did not sign the certificate accepted it")
    except ssl.SSLCertVerificationError:
        pass
    (proxy,) = proxy_pods(node, ns)

    # renewal: the Secret gets a new certificate and key while clients keep their connections
    second = ca.issue("second", hosts=hosts)
    handshakes: collections.Counter[str] = collections.Counter()
    names = {der(first): "first", der(second): "second"}

    def renewed() -> bool:
        """One new handshake (a request on a new connection): which certificate it got."""
        try:
            status, _, presented = get(tls, ip)
            got = names.get(presented, "unknown") if status == 200 else str(status)
        except (OSError, http.client.HTTPException) as exc:
            got = type(exc).__name__
        handshakes[got] += 1
        return got == "second"

    with Load(PORT, clients=8, host=ip, timeout_s=30, tls=tls) as load:
        wait_for(lambda: load.answered_since(time.monotonic() - 1) > 20, 30, what="load flowing")
        started = time.monotonic()
        node.apply(tls_secret(ns, SECRET, cert_manager_files(ca, second)))
        wait_for(renewed, DELIVERY_S, interval_s=1, what="new handshakes presenting the renewal")
        took = time.monotonic() - started
        end = time.monotonic() + 2.0
        wait_for(lambda: time.monotonic() >= end, 5, interval_s=0.1, what="two seconds more")
    failed = failures(load.outcomes)
    print(f"renewal: {len(load.outcomes)} requests on kept connections, failed {failed}; new "
          f"handshakes {dict(handshakes)}, the renewal presented after {took:.1f} s")  # fmt: skip
    assert set(handshakes) <= {"first", "second"}, handshakes
    assert len(load.outcomes) > 100
    assert failed == {}
    assert "TLS files reloaded" in node.pod_log(ns, proxy)

    # Secrets the proxies could not serve: the status names why, the proxy serving keeps serving
    third, other = ca.issue("third", hosts=hosts), ca.issue("other", hosts=hosts)
    expired = ca.issue("expired", hosts=hosts, expired=True)
    bad = [
        (cert_manager_files(ca, expired), "tls.crt: ssl_certfile 'tls.crt' expired on"),
        ({"tls.crt": third.cert, "tls.key": other.key, "ca.crt": ca.path}, "is not the key of"),
    ]
    for files, cause in bad:
        refused(node, ns, proxy, files, cause)
        assert presents(tls, ip, second), f"the proxy stopped serving after: {cause}"
    assert proxy_pods(node, ns) == {proxy: 0}

    # a proxy pod started on the bad Secret (rescheduled, say) waits for it, not Ready, and the
    # kubelet does not restart it meanwhile; the deleted one serves on while no other proxy is
    # ready (up to a minute, see LeavePlan), so the delete does not wait for it
    node.kubectl("delete", "pod", proxy, "-n", ns, "--wait=false")
    (waiting,) = wait_for(lambda: proxy_pods(node, ns), 60, what="a new proxy pod")
    stays_waiting(node, ns, waiting, LIVENESS_KILL_S)
    assert instance_condition(node, ns)["reason"] == "InvalidTLS"

    node.apply(tls_secret(ns, SECRET, cert_manager_files(ca, third)))
    running_again(node, ns)
    wait_for(lambda: presents(tls, ip, third), DELIVERY_S, interval_s=1, what="the good Secret")
    assert proxy_pods(node, ns) == {waiting: 0}


def stays_waiting(node: NodeCluster, ns: str, pod: str, seconds: float) -> None:
    """For ``seconds`` the proxy pod ``pod`` runs, not Ready, and is not restarted."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        obj = node.get("pod", pod, ns)
        restarts = sum(c["restartCount"] for c in obj["status"].get("containerStatuses", []))
        assert restarts == 0, f"the waiting proxy was restarted: {obj['status']}"
        conditions = {c["type"]: c["status"] for c in obj["status"].get("conditions", [])}
        assert conditions.get("Ready") != "True", "a proxy without loadable TLS files is Ready"
        time.sleep(2)  # observing that nothing happens for a while: there is no event to wait on
    assert "not listening until the TLS files load" in node.pod_log(ns, pod)


def test_a_secret_without_tls_key_then_client_certificates_required(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str, tmp_path: Path
) -> None:
    ns = node_namespace
    ca = Authority(tmp_path)
    server = ca.issue("server", hosts=(serving_name(ns),))
    # `kubectl create secret generic` with the key forgotten (a kubernetes.io/tls Secret must
    # have a tls.key: the API server refuses one without)
    keyless = tls_secret(ns, SECRET, {"tls.crt": server.cert, "ca.crt": ca.path}, "Opaque")
    node.apply([keyless, *with_tls(recorder(ns, 1), requireClientCertificates=True)])
    condition = invalid_tls(node, ns, "the Secret has no tls.key")
    assert condition["message"] == f"spec.tls.secretName '{SECRET}': the Secret has no tls.key"
    wait_ready(node, node_operator, ns, "faults")  # the application deploys all the same
    assert node.get("deployments", namespace=ns, selector=PROXIES)["items"] == []
    assert proxy_pods(node, ns) == {}

    node.kubectl("delete", "secret", SECRET, "-n", ns)  # a Secret's type cannot change
    fixed = time.monotonic()
    node.apply(tls_secret(ns, SECRET, cert_manager_files(ca, server)))
    running_again(node, ns)
    print(f"the instance Ready {time.monotonic() - fixed:.1f} s after the Secret was fixed")
    ip = cluster_ip(node, ns)
    member = client(ca, ns, ca.issue("member", client=True))
    wait_for(
        lambda: presents(member, ip, server), 60, interval_s=1, what="HTTPS with a client cert"
    )
    for who, tls in (
        ("no client certificate", client(ca, ns)),
        ("another CA's", client(ca, ns, Authority(tmp_path / "x", "x CA").issue("x", client=True))),
    ):
        try:
            status, _, _ = get(tls, ip)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            continue
        raise AssertionError(f"{who}: answered {status}")
    assert list(proxy_pods(node, ns).values()) == [0]
