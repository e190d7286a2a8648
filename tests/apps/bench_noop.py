"""The benchmark's no-op app (``benchmarks/apps.py:noop``) for pods of the Kubernetes test cluster.

Pods of the kubelet stand-in import from ``tests/apps`` (not ``benchmarks/``), so
``benchmarks/kubernetes_row.py`` deploys this copy: the same deployment, answering ``ok``.
"""

from kubeserve import Request, deployment


@deployment(max_ongoing_requests=100)
class Noop:
    def __call__(self, request: Request) -> str:
        return "ok"


noop = Noop.bind()
