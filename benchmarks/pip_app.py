"""The application of ``benchmarks/python_env.py``: it imports a package only its runtime_env
(``pip: [inflection==0.5.1]``) provides. Written against Ray's API, so both systems run it."""

import inflection  # type: ignore[import-not-found]
from ray import serve  # type: ignore[import-not-found]


@serve.deployment(ray_actor_options={"num_cpus": 0.25})
class Camel:
    def __call__(self, request: object) -> str:
        return str(inflection.camelize("hello_world"))


app = Camel.bind()
