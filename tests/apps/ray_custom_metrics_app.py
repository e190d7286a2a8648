"""Custom metrics as Ray Serve's documentation records them (``ray.serve.metrics``), plus one of
``ray.util.metrics`` (no Serve tags)."""

import time

from ray import serve
from ray.serve import metrics
from ray.util import metrics as util_metrics


@serve.deployment
class Counted:
    def __init__(self) -> None:
        self.num_requests = 0
        self.my_counter = metrics.Counter(
            "my_counter",
            description="The number of odd-numbered requests to this deployment.",
            tag_keys=("model",),
        )
        self.my_counter.set_default_tags({"model": "123"})
        self.my_histogram = metrics.Histogram(
            "my_histogram_ms",
            description="Time spent in __call__.",
            boundaries=[1, 2, 4, 8, 16, 32, 64],
            tag_keys=("route",),
        )
        self.my_gauge = metrics.Gauge("my_requests_seen", description="Requests seen so far.")
        self.plain = util_metrics.Counter("my_plain_counter", tag_keys=("kind",))

    def __call__(self) -> str:
        start = time.monotonic()
        self.num_requests += 1
        if self.num_requests % 2 == 1:
            self.my_counter.inc()
        self.my_gauge.set(self.num_requests)
        self.plain.inc(2, tags={"kind": "plain"})
        self.my_histogram.observe((time.monotonic() - start) * 1000)
        return "ok"


app = Counted.bind()
