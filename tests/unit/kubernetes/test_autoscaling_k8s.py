"""The operator's autoscaling helpers: scale-to-zero refusal and externally set counts."""

from __future__ import annotations

from kubeserve.backends.kubernetes.autoscaling import external_replicas, scale_to_zero_paths
from kubeserve.runtime.kubernetes import contract


def test_scale_to_zero_is_found_in_min_and_initial_replicas() -> None:
    deployments = [
        {"name": "A", "autoscaling_config": {"min_replicas": 1}},
        {"name": "B", "autoscaling_config": {"min_replicas": 0, "initial_replicas": 0}},
        {"name": "C", "num_replicas": 0},
    ]
    assert scale_to_zero_paths(deployments) == [
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
