# Autoscaling config: replicas between min and max by ongoing requests, starting at
# initial_replicas; serve.status() reports the deployment and its replicas.
import requests
from ray import serve


@serve.deployment(
    autoscaling_config={
        "min_replicas": 1,
        "initial_replicas": 2,
        "max_replicas": 4,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 3,
        "downscale_delay_s": 60,
    },
    max_ongoing_requests=5,
)
class Model:
    def __call__(self) -> str:
        return "ok"


serve.run(Model.bind(), name="autoscaled", route_prefix="/autoscaled")
assert requests.get("http://localhost:8000/autoscaled").text == "ok"

status = serve.status()
app = status.applications["autoscaled"]
assert app.status == "RUNNING", app
model = app.deployments["Model"]
print(model.status, model.replica_states)
assert model.status in ("HEALTHY", "UPSCALING", "DOWNSCALING"), model
assert 1 <= sum(model.replica_states.values()) <= 4
