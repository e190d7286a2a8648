"""Test application whose handler blocks its thread (``time.sleep``), as model code does.

``?sleeping`` answers how many requests are inside their ``time.sleep`` now, so a test knows
when a slow request is in its handler instead of guessing with a sleep of its own."""

import threading
import time

from kubeserve import Request, deployment


@deployment(health_check_period_s=0.2, health_check_timeout_s=1, max_ongoing_requests=4)
class Blocking:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sleeping = 0

    def __call__(self, request: Request) -> str:
        if "sleeping" in request.query_params:
            return str(self._sleeping)
        seconds = float(request.query_params.get("sleep", "0"))
        with self._lock:
            self._sleeping += 1
        try:
            time.sleep(seconds)
        finally:
            with self._lock:
                self._sleeping -= 1
        return f"slept {seconds:g}"

    def check_health(self) -> None:
        pass


app = Blocking.bind()
