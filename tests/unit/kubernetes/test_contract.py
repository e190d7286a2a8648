"""The Kubernetes contract: names and labels valid, readable when possible, distinct; the same
facts as the schema layer's."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest

from kubeserve.runtime.kubernetes import contract
from kubeserve.schema import resources

DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

APPS = ["app", "my-app", "a", "a-b", "my.app", "9lives", "x" * 63, "x" * 200, "default"]
DEPLOYMENTS = [
    "Model",
    "model",
    "b-c",
    "c",
    "Ingress_2",
    "naïve",
    "proxy",
    "0a1b2c3d",
    "y" * 80,
    "",
]


def test_readable_names_when_the_parts_are_valid() -> None:
    assert contract.workload_name("my-app", "model") == "my-app-model"
    assert contract.proxy_name("default") == "default-proxy"
    assert contract.build_job_name("my-app", "3f2a1b") == "my-app-build-3f2a1b"
    assert contract.build_job_name("my-app", 7) == "my-app-build-7"
    assert contract.graph_configmap_name("my-app", "3f2a1b") == "my-app-graph-3f2a1b"
    assert contract.dataplane_account_name("default") == "default-dataplane"
    assert contract.build_account_name("default") == "default-build"


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_workload_names_are_dns_1035_labels(app: str, deployment: str) -> None:
    name = contract.workload_name(app, deployment)
    assert len(name) <= 63
    assert DNS_1035.fullmatch(name), name
    assert name == contract.workload_name(app, deployment)  # stable


def test_distinct_inputs_give_distinct_workload_names() -> None:
    pairs = list(itertools.product(APPS, DEPLOYMENTS))
    rendered = {contract.workload_name(a, d) for a, d in pairs}
    assert len(rendered) == len(pairs)
    # the ambiguous joins and the case-only difference
    assert contract.workload_name("a-b", "c") != contract.workload_name("a", "b-c")
    assert contract.workload_name("app", "Model") != contract.workload_name("app", "model")
    # long names that share a 63-character prefix
    assert contract.workload_name("x" * 70, "a") != contract.workload_name("x" * 70, "b")


def test_a_deployment_named_proxy_never_takes_the_proxy_name() -> None:
    assert contract.workload_name("default", "proxy") != contract.proxy_name("default")


def test_other_names_are_valid_for_awkward_resource_names() -> None:
    for app in APPS:
        for name in (
            contract.build_job_name(app, "0123456789"),
            contract.graph_configmap_name(app, "0123456789"),
            contract.proxy_name(app),
            contract.dataplane_account_name(app),
        ):
            assert len(name) <= 63 and DNS_1035.fullmatch(name), name


@pytest.mark.parametrize(
    ("value", "unchanged"),
    [
        ("Model", True),
        ("my.app_1", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("naïve", False),
        ("two words", False),
        ("-lead", False),
        ("", True),
    ],
)
def test_label_values(value: str, unchanged: bool) -> None:
    label = contract.label_value(value)
    assert len(label) <= 63 and LABEL_VALUE.fullmatch(label)
    assert (label == value) is unchanged
    if not unchanged:
        assert label != contract.label_value(value + "x")


def test_selector_labels_are_a_subset_of_common_labels() -> None:
    common = contract.common_labels("replica", "default", "my-app", "Model")
    selector = contract.selector_labels("replica", application="my-app", deployment="Model")
    assert selector.items() <= common.items()
    assert common == {
        "app.kubernetes.io/name": "kubeserve",
        "app.kubernetes.io/managed-by": "kubeserve",
        "app.kubernetes.io/component": "replica",
        "kubeserve.io/instance": "default",
        "kubeserve.io/application": "my-app",
        "kubeserve.io/deployment": "Model",
    }


def test_owner_reference_from_an_object_or_its_identity() -> None:
    obj = {
        "apiVersion": "kubeserve.io/v1beta1",
        "kind": "ServeInstance",
        "metadata": {"name": "default", "uid": "u-1", "namespace": "ns"},
        "spec": {},
    }
    identity = {
        "apiVersion": "kubeserve.io/v1beta1",
        "kind": "ServeInstance",
        "name": "default",
        "uid": "u-1",
    }
    assert contract.owner_reference(obj, controller=False) == {
        **identity,
        "controller": False,
        "blockOwnerDeletion": True,
    }
    assert contract.owner_reference(identity)["controller"] is True


def test_the_custom_resources_identity_is_the_schemas() -> None:
    """The schema layer generates the CRDs and cannot import the contract: the two must agree."""
    assert (contract.GROUP, contract.VERSION, contract.API_VERSION) == (
        resources.GROUP,
        resources.VERSION,
        resources.API_VERSION,
    )
    assert contract.DEFAULT_INSTANCE == resources.DEFAULT_INSTANCE


def test_the_contract_loads_no_kubernetes_client_and_no_schema() -> None:
    """Every replica imports it, on one machine too: it must stay free to load."""
    code = (
        "import sys, kubeserve.runtime.kubernetes.contract, kubeserve.runtime.kubernetes.replica\n"
        "heavy = [m for m in sys.modules if m.startswith(('kubernetes_asyncio', 'kubeserve.schema',"
        " 'pydantic'))]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_application_name_is_app_name_else_the_object_name_and_empty_when_marked() -> None:
    assert contract.application_name({"metadata": {"name": "my-app"}, "spec": {}}) == "my-app"
    named = {"metadata": {"name": "my-app-1"}, "spec": {"appName": "My App.v1"}}
    assert contract.application_name(named) == "My App.v1"
    single = {
        "metadata": {
            "name": "app-e3b0c442",
            "annotations": {contract.APPLICATION_NAME_ANNOTATION: ""},
        },
        "spec": {},
    }
    assert contract.application_name(single) == ""  # the single-application PUT's name


@pytest.mark.parametrize(
    ("name", "expected"),
    [("text-ml", "text-ml"), ("1st", "1st"), ("", "app-e3b0c442"), ("My App.v1", "my-app-v1-")],
)
def test_application_cr_name(name: str, expected: str) -> None:
    cr_name = contract.application_cr_name(name)
    assert cr_name.startswith(expected)
    assert len(cr_name) <= contract.MAX_NAME_LENGTH


@pytest.mark.parametrize(
    ("typed", "model"),
    [
        (contract.ApplicationStatusEntry, resources.ServeApplicationStatus),
        (contract.DeploymentStatusEntry, resources.DeploymentStatusEntry),
    ],
)
def test_the_status_the_data_plane_reads_has_the_keys_the_operator_writes(
    typed: type, model: type[resources.CRModel]
) -> None:
    """The data plane cannot load the status models: its TypedDicts spell their aliases."""
    aliases = {info.alias or name for name, info in model.model_fields.items()}
    assert set(typed.__annotations__) == aliases


def test_an_application_belongs_to_the_instance_its_spec_names_else_the_default() -> None:
    assert contract.instance_of({"metadata": {"name": "a"}}) == contract.DEFAULT_INSTANCE
    assert contract.instance_of({"metadata": {"name": "a"}, "spec": {"instance": "blue"}}) == "blue"
    assert contract.application_status({"metadata": {"name": "a"}}) == {}
