"""The kubeserve side of the benchmark's applications (the composed one is ``examples.composed``).

``noop`` answers every request with ``ok``: what is measured is the serving layer, not user code.
"""

from kubeserve import Request, deployment


@deployment(max_ongoing_requests=100)
class Noop:
    def __call__(self, request: Request) -> str:
        return "ok"


noop = Noop.bind()
