"""A module that deploys itself with serve.run at its top level, as a script written for Ray
does; deployed by its import path, kubeserve's build imports it, and that serve.run must return
at once instead of waiting for the build it runs in."""

from ray import serve


@serve.deployment
def hello(request) -> str:
    return "hello from a self-deploying module"


app = hello.bind()
handle = serve.run(app, name="self-deploying", route_prefix="/self")
