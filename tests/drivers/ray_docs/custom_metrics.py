# Custom metrics: ray.serve.metrics Counter, Gauge and Histogram recorded by a deployment.
import time

import requests
from ray import serve
from ray.serve import metrics


@serve.deployment
class MyDeployment:
    def __init__(self):
        self.num_requests = 0
        self.my_counter = metrics.Counter(
            "my_counter",
            description="The number of odd-numbered requests to this deployment.",
            tag_keys=("model",),
        )
        self.my_counter.set_default_tags({"model": "123"})
        self.my_gauge = metrics.Gauge(
            "my_gauge",
            description="The number of requests seen so far.",
            tag_keys=("model",),
        )
        self.my_histogram = metrics.Histogram(
            "my_histogram",
            description="The time it took to answer.",
            boundaries=[0.001, 0.01, 0.1, 1],
            tag_keys=("model",),
        )

    def __call__(self):
        start = time.time()
        self.num_requests += 1
        if self.num_requests % 2 == 1:
            self.my_counter.inc()
        self.my_gauge.set(self.num_requests, tags={"model": "123"})
        self.my_histogram.observe(time.time() - start, tags={"model": "123"})
        return "counted"


serve.run(MyDeployment.bind(), name="metered", route_prefix="/metered")
for _ in range(5):
    response = requests.get("http://localhost:8000/metered")
    assert response.status_code == 200
print("sent 5 requests")
