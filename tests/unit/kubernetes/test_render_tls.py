"""``ServeInstance.spec.tls``: the proxies mount the Secret and serve HTTPS from it (pure), and
the operator's check of the Secret names what is wrong with it."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]

from kubeserve.backends.kubernetes import render
from kubeserve.backends.kubernetes.render_proxy import TLS_DIR
from kubeserve.backends.kubernetes.tls_secret import tls_problem
from kubeserve.runtime.kubernetes import contract
from kubeserve.schema.resources import ProxyTLS
from support.tls_certs import Authority

K8S_VERSION = "1.36.0"  # as tests/unit/kubernetes/test_render.py


def instance(**spec: Any) -> render.InstanceView:
    meta = {"name": "default", "namespace": "serving", "uid": "uid-inst"}
    return render.instance_view({"metadata": meta, "spec": spec})


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def proxy_container(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    workload = render.render_proxy(instance(proxyLocation="HeadOnly", **spec))[0]
    validate(workload)
    pod = workload["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_without_tls_the_proxy_is_plain_http() -> None:
    pod, proxy = proxy_container()
    assert not any(arg.startswith("--ssl") for arg in proxy["command"])
    assert proxy["readinessProbe"]["httpGet"].get("scheme", "HTTP") == "HTTP"
    assert all(v["name"] != "tls" for v in pod.get("volumes", []))


def test_tls_mounts_the_secret_and_probes_over_https() -> None:
    pod, proxy = proxy_container(tls={"secretName": "shop-cert"})
    command = proxy["command"]
    assert command[command.index("--ssl-certfile") + 1] == f"{TLS_DIR}/tls.crt"
    assert command[command.index("--ssl-keyfile") + 1] == f"{TLS_DIR}/tls.key"
    assert "--ssl-ca-certs" not in command
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "shop-cert"
    assert {"name": "tls", "mountPath": TLS_DIR, "readOnly": True} in proxy["volumeMounts"]
    assert proxy["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # alive while waiting for files that do not load: the metrics port listens meanwhile
    assert proxy["livenessProbe"]["tcpSocket"] == {"port": contract.METRICS_PORT}


def test_client_certificates_use_ca_crt_and_a_tcp_probe() -> None:
    _, proxy = proxy_container(tls={"secretName": "shop-cert", "requireClientCertificates": True})
    command = proxy["command"]
    assert command[command.index("--ssl-ca-certs") + 1] == f"{TLS_DIR}/ca.crt"
    assert proxy["readinessProbe"]["tcpSocket"] == {"port": 8000}
    assert proxy["livenessProbe"]["tcpSocket"] == {"port": contract.METRICS_PORT}


class SecretsOnly:
    """A Kube stand-in answering ``get`` of Secrets from a dict (the check reads nothing else)."""

    def __init__(self, secrets: dict[str, dict[str, bytes]]) -> None:
        self.secrets = secrets

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert kind == "Secret"
        data = self.secrets.get(name)
        if data is None:
            return None
        return {"data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def secret_of(cert: Path, key: Path, ca: Path | None = None) -> dict[str, bytes]:
    data = {"tls.crt": cert.read_bytes(), "tls.key": key.read_bytes()}
    return data | ({"ca.crt": ca.read_bytes()} if ca else {})


def problem(secrets: dict[str, dict[str, bytes]], **tls: Any) -> str | None:
    kube: Any = SecretsOnly(secrets)
    spec = ProxyTLS.model_validate({"secretName": "cert", **tls})
    return asyncio.run(tls_problem(kube, "serving", spec, {}))


def test_the_secret_check_names_what_is_wrong(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    good, other, expired = ca.issue("good"), ca.issue("other"), ca.issue("old", expired=True)
    assert problem({"cert": secret_of(good.cert, good.key)}) is None
    assert "no such Secret" in str(problem({}))
    mismatched = problem({"cert": secret_of(good.cert, other.key)})
    assert mismatched is not None and mismatched.startswith(
        "spec.tls.secretName 'cert': tls.key: ssl_keyfile 'tls.key' is not the key of"
    )
    assert "tls.crt: ssl_certfile 'tls.crt' expired on" in str(
        problem({"cert": secret_of(expired.cert, expired.key)})
    )
    needs_ca = problem({"cert": secret_of(good.cert, good.key)}, requireClientCertificates=True)
    assert needs_ca == "spec.tls.secretName 'cert': the Secret has no ca.crt"
    with_ca = secret_of(good.cert, good.key, ca.path)
    assert problem({"cert": with_ca}, requireClientCertificates=True) is None


def test_paths_in_http_options_are_refused_on_kubernetes() -> None:
    kube: Any = SecretsOnly({})
    options = {"http_options": {"ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem"}}
    found = asyncio.run(tls_problem(kube, "serving", None, options))
    assert found is not None and found.startswith("httpOptions.ssl_certfile: on Kubernetes")
