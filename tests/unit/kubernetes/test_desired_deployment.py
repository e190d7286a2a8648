"""The desired step of the application reconciler: which replica count a deployment is rendered
with, from the autoscaler, the external scaling API, the config and ``target_capacity``."""

from __future__ import annotations

from kubeserve.backends.kubernetes.application import desired_deployment
from kubeserve.control.effective_config import effective_deployment, replica_version

APP = {"name": "app", "import_path": "m:app"}


def test_the_configs_count_scaled_by_target_capacity() -> None:
    fixed = effective_deployment("Model", {"num_replicas": 4}, None)
    desired = desired_deployment(APP, fixed, None, {}, None)
    assert (desired.name, desired.target_replicas) == ("Model", 4)
    assert desired.version == replica_version(APP, fixed)
    assert desired_deployment(APP, fixed, None, {}, 50).target_replicas == 2


def test_the_external_scalers_count_beats_the_config() -> None:
    fixed = effective_deployment("Model", {"num_replicas": 4}, None)
    assert desired_deployment(APP, fixed, None, {"Model": 7}, 50).target_replicas == 7
    assert desired_deployment(APP, fixed, None, {"Other": 7}, None).target_replicas == 4


def test_the_autoscalers_decision_beats_everything() -> None:
    scaling = effective_deployment("Model", {"num_replicas": "auto"}, None)
    assert desired_deployment(APP, scaling, 3, {"Model": 7}, 50).target_replicas == 3
