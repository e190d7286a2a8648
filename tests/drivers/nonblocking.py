"""serve.run(blocking=False), then requests in a loop, with a helper module beside the script
(which the instance cannot import: it travels by value)."""

import json
import os
import urllib.request

from driver_helpers import Scorer, tag
from ray import serve


@serve.deployment(num_replicas=2)
class Model:
    def __init__(self):
        self.scorer = Scorer(weight=3)

    def __call__(self, request) -> str:
        return tag(self.scorer.score(int(request.query_params["v"])))


serve.run(Model.bind(), name="scored", route_prefix="/score", blocking=False)
answers = []
for v in range(4):
    with urllib.request.urlopen(f"{os.environ['PROXY_URL']}/score?v={v}", timeout=30) as resp:
        answers.append(resp.read().decode())
print(json.dumps({"answers": answers}))
