"""Capture the keys of Ray 2.60's GET /api/serve/applications/ answer, level by level.

Run with the Ray 2.60 virtualenv (``make ray-client``)::

    ~/.cache/kubeserve/ray-2.60.0/bin/python tests/reference/ray-2.60/capture_details_keys.py \
        > tests/reference/ray-2.60/details-keys.json

The application is the unit tests' ``composed`` (a Frontend calling a Greeter, two replicas, a
proxy): its ``deployment_config`` comes from Ray's own ``_deployment_info_to_schema``; the other
levels are the models' fields, all of which Ray's controller sets (it answers with
``exclude_unset=True``, so an unset field would be missing).
"""

import json

from ray.serve._private.config import DeploymentConfig, ReplicaConfig
from ray.serve._private.deployment_info import DeploymentInfo
from ray.serve.schema import (
    ApplicationDetails,
    DeploymentDetails,
    ProxyDetails,
    ReplicaDetails,
    ServeInstanceDetails,
    Target,
    TargetGroup,
    _deployment_info_to_schema,
)


def greeter() -> None:
    pass


info = DeploymentInfo(
    DeploymentConfig(num_replicas=2, user_config={"greeting": "Hi"}),
    ReplicaConfig.create(greeter, ray_actor_options={"num_cpus": 0.5}),
    start_time_ms=0,
    deployer_job_id="",
)
deployment_config = _deployment_info_to_schema("Greeter", info).model_dump(exclude_unset=True)
keys = {
    "instance": sorted(ServeInstanceDetails.model_fields),
    "application": sorted(ApplicationDetails.model_fields),
    "deployment": sorted(DeploymentDetails.model_fields),
    "deployment_config": sorted(deployment_config),
    "replica": sorted(ReplicaDetails.model_fields),
    "proxy": sorted(ProxyDetails.model_fields),
    "target_group": sorted(TargetGroup.model_fields),
    "target": sorted(Target.model_fields),
}
print(json.dumps(keys, indent=2))
