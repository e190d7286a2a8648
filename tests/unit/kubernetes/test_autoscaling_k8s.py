"""The operator's autoscaling helpers: scale to zero (refused without reports, decided on a
report) and externally set counts."""

from __future__ import annotations

from kubeserve.backends.kubernetes.autoscaling import (
    Autoscalers,
    external_replicas,
    scale_to_zero_paths,
    scaling_key,
)
from kubeserve.backends.kubernetes.backend import KubernetesBackend
from kubeserve.control.effective_config import effective_deployment
from kubeserve.runtime.kubernetes import contract


def test_scale_to_zero_is_found_in_min_and_initial_replicas() -> None:
    deployments = [
        {"name": "A", "autoscaling_config": {"min_replicas": 1}},
        {"name": "B", "autoscaling_config": {"min_replicas": 0, "initial_replicas": 0}},
        {"name": "C", "num_replicas": 0},
    ]
    assert scale_to_zero_paths(d.get("autoscaling_config") for d in deployments) == [
        (1, "autoscaling_config", "min_replicas"),
        (1, "autoscaling_config", "initial_replicas"),
    ]


def test_external_counts_come_from_the_annotation_and_bad_values_are_ignored() -> None:
    def obj(value: str | None) -> dict[str, object]:
        annotations = {} if value is None else {contract.EXTERNAL_REPLICAS_ANNOTATION: value}
        return {"metadata": {"annotations": annotations}}

    assert external_replicas(obj('{"A": 3, "B": -1, "C": "x"}')) == {"A": 3}
    assert external_replicas(obj("not json")) == {}
    assert external_replicas(obj("[1]")) == {}
    assert external_replicas(obj(None)) == {}


class _Reports:
    """A LoadReportSink as the operator is one: the reports it was given, by scaler."""

    def __init__(self, scales_to_zero: bool) -> None:
        self.scales_to_zero = scales_to_zero

    def instance_secret(self, namespace: str, instance: str) -> bytes | None:
        return None

    def record_queued(
        self, namespace: str, instance: str, caller_id: str, queued: dict[str, int]
    ) -> None:
        raise AssertionError("not reached")


def test_scaling_to_zero_is_refused_only_where_pods_cannot_report_to_the_operator() -> None:
    config = {"deployments": [{"name": "A", "autoscaling_config": {"min_replicas": 0}}]}
    for reports in (None, _Reports(scales_to_zero=False)):
        backend = KubernetesBackend(None, None, "ns", reports=reports)  # type: ignore[arg-type]
        [refusal] = backend.refusals(config)
        assert refusal["loc"] == ["deployments", 0, "autoscaling_config", "min_replicas"]
        assert "--report-url" in refusal["msg"]
    backend = KubernetesBackend(None, None, "ns", reports=_Reports(True))  # type: ignore[arg-type]
    assert backend.refusals(config) == []


def test_a_report_for_a_deployment_at_zero_decides_at_once_and_wakes_the_operator() -> None:
    woken: list[list[str]] = []
    scalers = Autoscalers(on_decided=lambda keys: woken.append(list(keys)))
    key = scaling_key("ns", "app", "Slow")
    config = effective_deployment(
        "Slow", {}, {"autoscaling_config": {"min_replicas": 0, "max_replicas": 2}}
    )
    assert scalers.target(key, config) == 0
    scalers.record_queued(key, "proxy-1", 0)
    assert woken == []
    scalers.record_queued(key, "proxy-1", 1)
    assert woken == [[key]]  # only this deployment's application is woken
    assert scalers.target(key, config) == 1
    decision = scalers.last_decision(key)
    assert decision is not None and decision["curr_num_replicas"] == 1
    scalers.record_queued("ns/other/Slow", "proxy-1", 5)  # no such autoscaler: ignored
    assert woken == [[key]]
