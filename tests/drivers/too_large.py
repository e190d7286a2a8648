"""Bound arguments over the pickled graph's limit: the instance answers 413 naming the limit."""

import json
import os

from ray import serve
from ray.serve.exceptions import RayServeException


@serve.deployment
class Holder:
    def __init__(self, blob: bytes):
        self.size = len(blob)


try:
    serve.run(Holder.bind(os.urandom(5 * 1024 * 1024)), name="holder")
except RayServeException as exc:
    print(json.dumps({"error": str(exc), "apps": sorted(serve.status().applications)}))
