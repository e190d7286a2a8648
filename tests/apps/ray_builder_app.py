"""Application builders as Ray's documentation writes them (passing arguments to applications)."""

from typing import Dict

from pydantic import BaseModel
from ray import serve
from ray.serve import Application


@serve.deployment
class HelloWorld:
    def __init__(self, message: str):
        self._message = message

    def __call__(self, request):
        context = serve.get_replica_context()
        return {"message": self._message, "app": context.app_name, "replica": context.replica_tag}


def app_builder(args: Dict[str, str]) -> Application:
    return HelloWorld.bind(args["message"])


class HelloWorldArgs(BaseModel):
    message: str


def typed_app_builder(args: HelloWorldArgs) -> Application:
    return HelloWorld.bind(args.message)


bound = HelloWorld.bind("bound")
