"""``ServeInstance.spec.logs.accessLines``: where proxy and replica pods write access lines (pure).

``File`` (the default): a rotated file in an ``emptyDir`` sized to hold it at its limits, named to
the process by ``KUBESERVE_ACCESS_LOG_FILE``; ``ContainerOutput``: nothing of it is rendered (the
lines go with the records to the container's output)."""

from __future__ import annotations

from typing import Any

import pytest

from kubeserve.runtime import logs
from kubeserve.runtime.kubernetes import contract
from kubeserve.schema.resources import InstanceLogs
from support.rendered_pods import env, instance, proxy_pod, replica_pod

Json = dict[str, Any]
VOLUME = {"name": "access-log", "emptyDir": {"sizeLimit": "96Mi"}}
MOUNT = {"name": "access-log", "mountPath": "/var/log/kubeserve"}


@pytest.mark.parametrize("spec", [{}, {"logs": {}}, {"logs": {"accessLines": "File"}}])
@pytest.mark.parametrize("render_pod", [proxy_pod, replica_pod], ids=["proxy", "replica"])
def test_by_default_access_lines_go_to_a_rotated_file_in_the_pod(
    spec: Json, render_pod: Any
) -> None:
    pod = render_pod(instance(**spec))
    (main,) = pod["containers"]
    assert env(main)[logs.ACCESS_LOG_FILE_ENV] == contract.ACCESS_LOG_FILE
    assert contract.ACCESS_LOG_FILE == "/var/log/kubeserve/access.log"
    assert MOUNT in main["volumeMounts"] and VOLUME in pod["volumes"]
    # the emptyDir holds the file and its rotated copies at their limits, with room to roll
    held = (logs.DEFAULT_LOG_BACKUPS + 1) * logs.DEFAULT_LOG_BYTES
    assert held < 96 * 2**20 and logs.LOG_BYTES_ENV not in env(main)
    for other in pod.get("initContainers", []):
        assert MOUNT not in other.get("volumeMounts", [])


@pytest.mark.parametrize("render_pod", [proxy_pod, replica_pod], ids=["proxy", "replica"])
def test_container_output_keeps_access_lines_with_the_records(render_pod: Any) -> None:
    pod = render_pod(instance(logs={"accessLines": "ContainerOutput"}))
    (main,) = pod["containers"]
    assert logs.ACCESS_LOG_FILE_ENV not in env(main)
    assert MOUNT not in main["volumeMounts"] and VOLUME not in pod["volumes"]


def test_an_unknown_destination_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="accessLines") as error:
        InstanceLogs.model_validate({"accessLines": "Syslog"})
    assert "'File' or 'ContainerOutput'" in str(error.value)
