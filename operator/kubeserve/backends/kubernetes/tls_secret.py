"""Checking the Secret a ``ServeInstance``'s ``spec.tls`` names, before a proxy mounts it.

A Secret the proxies could not serve (missing, a key that is not the certificate's, an expired
certificate, no ``ca.crt`` when client certificates are required) stops the proxies from being
rendered: the instance's status says why, the proxies already running keep serving, and none
starts to wait on files that will not load. The check loads the keys as the proxy will
(:func:`kubeserve.runtime.tls.check_files`), from a private temporary directory.
"""

from __future__ import annotations

import base64
import binascii
import tempfile
from pathlib import Path
from typing import Any

from kubeserve.control.instance import tls_path_refusals
from kubeserve.runtime.kubernetes.client import Kube
from kubeserve.runtime.tls import TLSFileError, TLSFiles, check_files
from kubeserve.schema.resources import ProxyTLS

__all__ = ["tls_problem"]

#: the Secret's key for each ``http_options`` field the check may name
_KEYS = {"ssl_certfile": "tls.crt", "ssl_keyfile": "tls.key", "ssl_ca_certs": "ca.crt"}


async def tls_problem(
    kube: Kube, namespace: str, tls: ProxyTLS | None, rest_options: dict[str, Any]
) -> str | None:
    """Why the instance's proxies cannot serve its TLS settings, or ``None`` when they can."""
    for refused in tls_path_refusals(rest_options):
        return f"httpOptions.{refused['loc'][-1]}: {refused['msg']}"
    if tls is None:
        return None
    where = f"spec.tls.secretName {tls.secret_name!r}"
    secret = await kube.get("Secret", namespace, tls.secret_name)
    if secret is None:
        return f"{where}: no such Secret in namespace {namespace}"
    wanted = ["tls.crt", "tls.key"] + (["ca.crt"] if tls.require_client_certificates else [])
    data = secret.get("data") or {}
    missing = [key for key in wanted if not data.get(key)]
    if missing:
        return f"{where}: the Secret has no {', '.join(missing)}"
    try:
        files = {key: base64.b64decode(data[key], validate=True) for key in wanted}
    except (binascii.Error, ValueError):
        return f"{where}: the Secret's data is not base64"
    return _check(where, files)


def _check(where: str, files: dict[str, bytes]) -> str | None:
    with tempfile.TemporaryDirectory(prefix="kubeserve-tls-") as tmp:
        for key, content in files.items():
            (Path(tmp) / key).write_bytes(content)
        ca = str(Path(tmp) / "ca.crt") if "ca.crt" in files else None
        try:
            check_files(TLSFiles(str(Path(tmp) / "tls.crt"), str(Path(tmp) / "tls.key"), None, ca))
        except TLSFileError as exc:
            reason = str(exc).replace(tmp + "/", "")
            return f"{where}: {_KEYS.get(exc.field, exc.field)}: {reason}"
    return None
