# serve.run(..., blocking=True): deploys, then blocks until interrupted (Ctrl-C).
from ray import serve


@serve.deployment
def hello() -> str:
    return "still here"


serve.run(hello.bind(), name="blocking", route_prefix="/blocking", blocking=True)
