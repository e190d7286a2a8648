"""Rules about the serving layer as a whole (the instance), independent of any backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeserve.schema.config import LoggingConfig

#: Instance options that cannot change while the serving layer runs (to change them: shut down,
#: then deploy again).
_IMMUTABLE_HTTP_FIELDS = ("host", "port", "root_path")


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
            return (
                f"http_options.{field} of a running serving layer cannot change "
                f"({old.get(field)!r} -> {new.get(field)!r}): "
                "DELETE it first, then PUT the new config"
            )
    if proxy_logging_config(running) != proxy_logging_config(requested):
        return (
            "logging_config of a running serving layer (its proxy's logging) cannot change: "
            "DELETE it first, then PUT the new config; an application's or a deployment's "
            "logging_config can change at any time"
        )
    return None


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
