"""The deployment defined and bound inside a function (Ray's application-builder style), never
bound to a module-level name; a closure variable travels with it."""

import json

from ray import serve


def build(greeting: str):
    @serve.deployment
    class Greeter:
        def __call__(self, name: str) -> str:
            return f"{greeting}, {name}!"

    return Greeter.bind()


def main() -> None:
    handle = serve.run(build("Bonjour"), name="greeter", route_prefix="/greet")
    print(json.dumps({"greeting": handle.remote("Ada").result()}))


main()
