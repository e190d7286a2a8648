"""Ray 2.60's custom autoscaling policy given as a callable of the driver script itself (not
importable by the instance): the decorator takes the function, ``serve.run`` ships it with the
graph, and it decides the replica count."""

import json
import time

from ray import serve
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy


def three_replicas(ctx: AutoscalingContext):
    """Ask for three replicas; count the calls in the state the policy keeps."""
    return 3, {"calls": ctx.policy_state.get("calls", 0) + 1}


@serve.deployment(
    autoscaling_config=AutoscalingConfig(
        min_replicas=1,
        max_replicas=5,
        metrics_interval_s=0.5,
        upscale_delay_s=0,
        policy=AutoscalingPolicy(policy_function=three_replicas),
    )
)
class Model:
    def __call__(self):
        return "ok"


handle = serve.run(Model.bind(), name="policed", route_prefix="/policed")
deadline = time.monotonic() + 60
replicas = {}
while time.monotonic() < deadline:
    replicas = serve.status().applications["policed"].deployments["Model"].replica_states
    if replicas.get("RUNNING") == 3:
        break
    time.sleep(0.2)
print(json.dumps({"replicas": replicas, "answer": handle.remote().result()}))
