"""The application bound under ``if __name__ == "__main__":`` and passed straight to serve.run,
with a function deployment and a module-level helper the deployment calls."""

import json

from ray import serve


def shout(text: str) -> str:
    return text.upper() + "!"


@serve.deployment
def echo(text: str) -> str:
    return shout(text)


@serve.deployment(num_replicas=2)
class Counter:
    def __init__(self, start: int):
        self.count = start

    def next(self) -> int:
        self.count += 1
        return self.count


if __name__ == "__main__":
    echoed = serve.run(echo.bind(), name="echo", route_prefix="/echo").remote("hi").result()
    counter = serve.run(Counter.bind(start=41), name="counter", route_prefix=None)
    print(json.dumps({"echo": echoed, "next": counter.next.remote().result()}))
