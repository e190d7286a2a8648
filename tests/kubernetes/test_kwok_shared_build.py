"""One build per distinct build input, on kwok: applications of the same image, module and
environment share one build Job and one graph ConfigMap, each of them an owner; a change of one
application's inputs gives it a build of its own and leaves the shared one; deleting an
application leaves the others serving (and collects a build nobody uses); a failed shared build
fails every application that uses it, each saying why, and an application that did not own it
gets a new attempt once the failure is older than ``RETRY_FAILED_BUILD_S``."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from kubeserve.backends.kubernetes import render
from kubeserve.backends.kubernetes.application import RETRY_FAILED_BUILD_S
from kubeserve.runtime.kubernetes import contract
from kubeserve.schema.resources import ServeApplicationSpec
from support.common import wait_for
from support.k8s_operator import (
    KUBESERVE_IMAGE,
    OperatorProcess,
    application,
    instance,
    ready_at_generation,
)
from support.kwok_cluster import KwokCluster

BUILDS = "app.kubernetes.io/component=build"
MANAGED = {contract.MANAGED_BY_LABEL: contract.PRODUCT}


def _status(kwok: KwokCluster, namespace: str, name: str) -> dict[str, Any]:
    return kwok.get("serveapplication", name, namespace=namespace).get("status") or {}


def _ready(kwok: KwokCluster, namespace: str, name: str) -> bool:
    return ready_at_generation(kwok.get("serveapplication", name, namespace=namespace))


def _builds(kwok: KwokCluster, namespace: str, kind: str) -> dict[str, set[str]]:
    """Each build object of ``kind`` in the namespace: the applications owning it."""
    items = kwok.get(kind, namespace=namespace, selector=BUILDS)["items"]
    return {
        i["metadata"]["name"]: {o["name"] for o in i["metadata"].get("ownerReferences") or []}
        for i in items
    }


def _wait(kwok: KwokCluster, operator: OperatorProcess, check: Any, what: str) -> None:
    try:
        wait_for(check, 120, interval_s=0.5, what=what)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{operator.log()[-4000:]}") from None


@pytest.mark.timeout(420)
def test_applications_of_one_build_input_share_one_build(
    kwok: KwokCluster, kwok_namespace: str, kwok_operator: OperatorProcess
) -> None:
    ns = kwok_namespace
    kwok.apply(instance(ns, image=KUBESERVE_IMAGE))
    kwok.apply(
        [
            application(ns, name, "ks_composed_app:app", routePrefix=f"/{name}")
            for name in ("a", "b")
        ]
    )
    _wait(kwok, kwok_operator, lambda: _ready(kwok, ns, "a") and _ready(kwok, ns, "b"), "a, b")
    # one build for both: one Job, one graph, each owned by both
    _wait(
        kwok,
        kwok_operator,
        lambda: list(_builds(kwok, ns, "configmaps").values()) == [{"a", "b"}],
        "one graph owned by a and b",
    )
    (shared,) = _builds(kwok, ns, "configmaps")
    assert list(_builds(kwok, ns, "jobs")) == [shared]
    graph = kwok.get("configmap", shared, namespace=ns)["data"]

    # b's own inputs change: a build of its own; it leaves the shared one to a
    patch = {"spec": {"runtimeEnv": {"envVars": {"CHANGED": "1"}}}}
    kwok.kubectl(
        "patch", "serveapplication", "b", "-n", ns, "--type=merge", "-p", json.dumps(patch)
    )
    _wait(kwok, kwok_operator, lambda: _ready(kwok, ns, "b"), "b Ready after its change")
    _wait(
        kwok,
        kwok_operator,
        lambda: sorted(map(sorted, _builds(kwok, ns, "configmaps").values())) == [["a"], ["b"]],
        "two graphs, one per application",
    )
    assert _builds(kwok, ns, "configmaps")[shared] == {"a"}
    (own,) = set(_builds(kwok, ns, "configmaps")) - {shared}

    # a goes: its build (nobody else uses it) is collected, b keeps serving with its own
    kwok.kubectl("delete", "serveapplication", "a", "-n", ns)
    _wait(
        kwok,
        kwok_operator,
        lambda: (
            list(_builds(kwok, ns, "configmaps")) == [own]
            and shared not in _builds(kwok, ns, "jobs")
        ),
        "a's build collected",
    )
    assert _ready(kwok, ns, "b") and _status(kwok, ns, "b")["appStatus"] == "RUNNING"
    replicas = kwok.get("deployments", namespace=ns, selector="kubeserve.io/application=b")
    assert len(replicas["items"]) == 3

    # an application built by an operator of before shared builds keeps its own graph
    legacy = application(ns, "e", "ks_composed_app:app", routePrefix="/e")
    config = ServeApplicationSpec.model_validate(legacy["spec"]).app_config(name="e")
    legacy_key = render.app_view({"metadata": {"name": "e", "namespace": ns, "uid": ""}}, config)
    kwok.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": contract.graph_configmap_name("e", legacy_key.build_key),
                "namespace": ns,
                "labels": {**contract.selector_labels("build", application="e"), **MANAGED},
            },
            "data": graph,
        }
    )
    kwok.apply(legacy)
    _wait(kwok, kwok_operator, lambda: _ready(kwok, ns, "e"), "e Ready on its own graph")
    assert shared not in _builds(kwok, ns, "jobs")  # nothing built again

    # a build that fails, shared by two applications: both fail, each with the build's error
    kwok.apply(
        [
            application(ns, name, "ks_no_such_module:app", routePrefix=f"/{name}")
            for name in ("c", "d")
        ]
    )

    def both_failed() -> bool:
        return all(_status(kwok, ns, n).get("appStatus") == "DEPLOY_FAILED" for n in ("c", "d"))

    _wait(kwok, kwok_operator, both_failed, "c and d DEPLOY_FAILED")
    for name in ("c", "d"):
        assert "ks_no_such_module" in _status(kwok, ns, name)["message"]
    assert len(_builds(kwok, ns, "jobs")) == 2  # b's and the failed one, shared by c and d
    assert _ready(kwok, ns, "b")

    # an application that did not own the failed build, asking for it once the failure is older
    # than RETRY_FAILED_BUILD_S, gets a new attempt (a failure may be transient), shared again
    (failed,) = [n for n, owners in _builds(kwok, ns, "configmaps").items() if owners == {"c", "d"}]
    first = kwok.get("job", failed, namespace=ns)["metadata"]["uid"]
    time.sleep(RETRY_FAILED_BUILD_S + 1)
    kwok.apply(application(ns, "f", "ks_no_such_module:app", routePrefix="/f"))

    def attempted_again() -> bool:
        jobs = kwok.get("jobs", namespace=ns, selector=BUILDS)["items"]
        return any(j["metadata"]["name"] == failed and j["metadata"]["uid"] != first for j in jobs)

    _wait(kwok, kwok_operator, attempted_again, "a new attempt of the failed build")

    def all_failed() -> bool:
        return all(
            _status(kwok, ns, n).get("appStatus") == "DEPLOY_FAILED" for n in ("c", "d", "f")
        )

    _wait(kwok, kwok_operator, all_failed, "c, d and f DEPLOY_FAILED by the new attempt")
    assert kwok.get("job", failed, namespace=ns)["metadata"]["uid"] != first
    _wait(
        kwok,
        kwok_operator,
        lambda: _builds(kwok, ns, "configmaps").get(failed) == {"c", "d", "f"},
        "the new attempt's graph owned by c, d and f",
    )
