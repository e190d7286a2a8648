"""A lock passed to .bind(): serve.run fails in the driver, naming it; nothing is deployed."""

import json
import threading

from ray import serve


@serve.deployment
class Guarded:
    def __init__(self, settings: dict):
        self.settings = settings


try:
    serve.run(Guarded.bind({"retries": 3, "lock": threading.Lock()}), name="guarded")
except TypeError as exc:
    print(json.dumps({"error": str(exc), "apps": sorted(serve.status().applications)}))
