"""``ServeInstance.spec.proxy.dataPath``: which data path the proxy pods run (pure), how it is
validated (the model, and the CRD the API server checks first), and the operator's default."""

from __future__ import annotations

import argparse
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from pydantic import ValidationError

from kubeserve.backends.kubernetes import render
from kubeserve.cli.operator import add_arguments
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath
from kubeserve.schema.crd import crd_manifests
from kubeserve.schema.errors import validation_details
from kubeserve.schema.resources import ServeInstanceSpec

K8S_VERSION = "1.36.0"  # as tests/unit/kubernetes/test_render.py


def instance(default: DataPath = DEFAULT_DATA_PATH, **spec: Any) -> render.InstanceView:
    meta = {"name": "default", "namespace": "serving", "uid": "uid-inst"}
    return render.instance_view({"metadata": meta, "spec": spec}, None, default)


def proxy_command(default: DataPath = DEFAULT_DATA_PATH, **spec: Any) -> list[str]:
    workload = render.render_proxy(instance(default, proxyLocation="HeadOnly", **spec))[0]
    kubernetes_validate.validate(workload, K8S_VERSION, strict=True)
    command: list[str] = workload["spec"]["template"]["spec"]["containers"][0]["command"]
    return command


def data_path_of(command: list[str]) -> str:
    """What ``kubeserve proxy`` runs with: its ``--data-path``, else its own default (native,
    where the image ships the binary)."""
    if "--data-path" not in command:
        return DataPath.NATIVE.value
    return command[command.index("--data-path") + 1]


def test_the_default_is_native() -> None:
    assert DEFAULT_DATA_PATH is DataPath.NATIVE
    assert data_path_of(proxy_command()) == "native"
    # no flag: the proxy's own default, native, which falls back to python (said in its log) in
    # an image without kubeserve-fastpath, where an explicit --data-path native would fail
    assert "--data-path" not in proxy_command()


def test_native_runs_the_proxy_with_the_native_data_path() -> None:
    command = proxy_command(proxy={"dataPath": "native"})
    assert data_path_of(command) == "native"
    # the flag sits among the proxy's options, before its fixed drain settings
    assert command.index("--data-path") < command.index("--replacement-wait-s")


def test_python_is_always_said() -> None:
    """The Python path is the proxy's escape hatch, given as a flag whoever chose it."""
    for default, spec in ((DataPath.PYTHON, {}), (DataPath.NATIVE, {"dataPath": "python"})):
        command = proxy_command(default, proxy=spec)
        assert command[command.index("--data-path") + 1] == "python"


def test_the_spec_overrides_the_operators_default_both_ways() -> None:
    assert data_path_of(proxy_command(DataPath.NATIVE)) == "native"
    assert data_path_of(proxy_command(DataPath.NATIVE, proxy={"dataPath": "python"})) == "python"
    assert data_path_of(proxy_command(DataPath.NATIVE, proxy={})) == "native"


def test_native_serves_the_instances_tls_too() -> None:
    """The native process terminates HTTPS from the files the Python proxy loads: both flags."""
    for default, spec in ((DataPath.NATIVE, {}), (DataPath.PYTHON, {"dataPath": "native"})):
        command = proxy_command(default, proxy=spec, tls={"secretName": "shop-cert"})
        assert data_path_of(command) == "native"
        assert "--ssl-certfile" in command


def errors_of(spec: dict[str, Any]) -> list[Any]:
    with pytest.raises(ValidationError) as caught:
        ServeInstanceSpec.model_validate(spec)
    return validation_details(caught.value)


def test_an_unknown_data_path_is_refused_at_its_path() -> None:
    (error,) = errors_of({"proxy": {"dataPath": "turbo"}})
    assert error["loc"] == ["proxy", "dataPath"]
    assert "'python' or 'native'" in error["msg"]


def test_unknown_proxy_fields_are_refused() -> None:
    (error,) = errors_of({"proxy": {"dataPath": "native", "threads": 4}})
    assert error["loc"] == ["proxy", "threads"]


def test_the_data_path_is_no_rest_option() -> None:
    spec = ServeInstanceSpec.model_validate({"proxy": {"dataPath": "native"}})
    assert "proxy" not in spec.rest_options()


def instance_crd_spec() -> dict[str, Any]:
    (crd,) = [c for c in crd_manifests() if c["spec"]["names"]["kind"] == "ServeInstance"]
    version = crd["spec"]["versions"][0]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def test_the_crd_lets_the_api_server_refuse_what_the_model_refuses() -> None:
    spec = instance_crd_spec()
    data_path = spec["properties"]["proxy"]["properties"]["dataPath"]
    assert data_path["enum"] == ["python", "native"]
    assert "default" not in data_path  # unset means the operator's default


def test_the_operator_flag_defaults_to_the_constant() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).proxy_data_path == DEFAULT_DATA_PATH.value
    assert parser.parse_args(["--proxy-data-path", "native"]).proxy_data_path == "native"
    with pytest.raises(SystemExit):
        parser.parse_args(["--proxy-data-path", "turbo"])
