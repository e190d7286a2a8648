"""Rules about the serving layer as a whole (the instance), independent of any backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeserve.schema.config import LoggingConfig
from kubeserve.schema.errors import ErrorDetail

#: Instance options that cannot change while the serving layer runs (to change them: shut down,
#: then deploy again). The TLS files' contents may change (the proxy reloads them), their paths not,
#: as in Ray.
_IMMUTABLE_HTTP_FIELDS = (
    "host",
    "port",
    "root_path",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_keyfile_password",
    "ssl_ca_certs",
)
#: The ``grpc_options`` a proxy is started with (its gRPC listener and the services it imports).
#: The ``grpc_options`` the proxy is started with, and their defaults.
_IMMUTABLE_GRPC_FIELDS: dict[str, Any] = {
    "port": 9000,
    "grpc_servicer_functions": None,
    "request_timeout_s": None,
    "enable_reflection": True,
}


def proxy_logging_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """The serve config's top-level ``logging_config`` (the proxies'), Ray's defaults filled."""
    return LoggingConfig.model_validate(options.get("logging_config") or {}).model_dump(mode="json")


def immutable_option_conflict(
    running: Mapping[str, Any] | None, requested: Mapping[str, Any]
) -> str | None:
    """Why ``requested`` instance options cannot be applied to a running instance, or ``None``.

    Both are instance option dicts (``http_options`` ...) with defaults filled.
    """
    if running is None:
        return None
    old = running.get("http_options") or {}
    new = requested.get("http_options") or {}
    for field in _IMMUTABLE_HTTP_FIELDS:
        if old.get(field) != new.get(field):
            change = (
                ""
                if field == "ssl_keyfile_password"
                else f" ({old.get(field)!r} -> {new.get(field)!r})"
            )
            return (
                f"http_options.{field} of a running serving layer cannot change{change}: "
                "DELETE it first, then PUT the new config"
            )
    old_grpc = running.get("grpc_options") or {}
    new_grpc = requested.get("grpc_options") or {}
    for field, default in _IMMUTABLE_GRPC_FIELDS.items():
        before, after = old_grpc.get(field, default), new_grpc.get(field, default)
        if before != after:
            return (
                f"grpc_options.{field} of a running serving layer cannot change "
                f"({before!r} -> {after!r}): "
                "DELETE it first, then PUT the new config"
            )
    if proxy_logging_config(running) != proxy_logging_config(requested):
        return (
            "logging_config of a running serving layer (its proxy's logging) cannot change: "
            "DELETE it first, then PUT the new config; an application's or a deployment's "
            "logging_config can change at any time"
        )
    return None


def grpc_proxy_arguments(grpc_options: Mapping[str, Any] | None) -> list[str]:
    """The proxy's command-line arguments for ``grpc_options``: none without servicer functions
    (Ray starts no gRPC server then either)."""
    grpc = grpc_options or {}
    functions = [str(f) for f in grpc.get("grpc_servicer_functions") or ()]
    if not functions:
        return []
    args = ["--grpc-port", str(int(grpc.get("port", 9000)))]
    for function in functions:
        args += ["--grpc-servicer-function", function]
    if grpc.get("request_timeout_s") is not None:
        args += ["--grpc-request-timeout-s", str(grpc["request_timeout_s"])]
    if grpc.get("enable_reflection") is False:
        args.append("--grpc-no-reflection")
    return args


#: Where TLS comes from on Kubernetes, instead of ``http_options.ssl_*`` paths.
TLS_FROM_SECRET = (
    "on Kubernetes the proxies' TLS comes from a Secret (tls.crt, tls.key and, for client "
    "certificates, ca.crt, as a cert-manager Certificate writes it): name it in the "
    "ServeInstance's spec.tls.secretName; a path names a file on no proxy pod"
)
_TLS_FIELDS = ("ssl_certfile", "ssl_keyfile", "ssl_keyfile_password", "ssl_ca_certs")


def tls_path_refusals(options: Mapping[str, Any]) -> list[ErrorDetail]:
    """The ``http_options.ssl_*`` fields of instance ``options`` a Kubernetes instance refuses."""
    http = options.get("http_options") or {}
    return [
        {"loc": ["http_options", field], "msg": TLS_FROM_SECRET}
        for field in _TLS_FIELDS
        if http.get(field)
    ]


def app_route_prefix(
    app_config: Mapping[str, Any], ingress_options: Mapping[str, Any]
) -> str | None:
    """The route of an application: its config's, else its ingress deployment's code, else ``/``."""
    if "route_prefix" in app_config:
        value = app_config["route_prefix"]
        return None if value is None else str(value)
    if "route_prefix" in ingress_options:
        value = ingress_options["route_prefix"]
        return None if value is None else str(value)
    return "/"


def external_scaler_disabled(app: str, deployment: str) -> str:
    """Ray 2.60's refusal of an external scaling request for an application that did not opt in."""
    return (
        f"Cannot update replicas for deployment '{deployment}' in application '{app}'. The "
        "external scaling API can only be used when 'external_scaler_enabled' is set to true in "
        "the application configuration. Current value: external_scaler_enabled=false. To use "
        "this API, redeploy your application with 'external_scaler_enabled: true' in the config."
    )


def prefix_in_use(name: str, prefix: str | None, live: Mapping[str, str | None]) -> str | None:
    """Ray 2.60's refusal of a deploy whose ``prefix`` another application of ``live`` (name ->
    route prefix, the applications not being deleted) serves, or ``None``; an application may
    keep its own prefix."""
    if prefix is None:
        return None
    for other, other_prefix in live.items():
        if other != name and other_prefix == prefix:
            return (
                f'Prefix {prefix} is being used by application "{other}". '
                f'Failed to deploy application "{name}".'
            )
    return None
