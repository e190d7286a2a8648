"""Test application whose handler blocks its thread (``time.sleep``), as model code does."""

import time

from kubeserve import Request, deployment


@deployment(health_check_period_s=0.2, health_check_timeout_s=1, max_ongoing_requests=4)
class Blocking:
    def __call__(self, request: Request) -> str:
        seconds = float(request.query_params.get("sleep", "0"))
        time.sleep(seconds)
        return f"slept {seconds:g}"

    def check_health(self) -> None:
        pass


app = Blocking.bind()
