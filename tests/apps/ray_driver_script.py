"""A Ray Serve driver script: serve.run, handles from outside the replicas, status, delete."""

import asyncio
import json

from ray import serve
from ray_composition_app import math_app

handle = serve.run(math_app, name="driven", route_prefix="/driven")
out = {"result": handle.remote(4).result()}
streamer = serve.get_deployment_handle("Streamer", app_name="compose").options(stream=True)
out["streamed"] = list(streamer.remote(3))


async def main():
    return await handle.remote(5)


out["awaited"] = asyncio.run(main())
out["status"] = serve.status().applications["driven"].status
serve.delete("driven")
out["after_delete"] = "driven" in serve.status().applications
print(json.dumps(out))
