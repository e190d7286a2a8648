"""A replica loads only what its application uses: no schema models, no pydantic, no Kubernetes
client for a plain ``@deployment`` class (their memory is most of a replica's growth otherwise)."""

from __future__ import annotations

import subprocess
import sys

from support.common import ROOT


def test_a_replica_of_a_plain_deployment_loads_no_schema_pydantic_or_kubernetes_client() -> None:
    code = (
        "import sys, kubeserve.runtime.replica.server, kubeserve.runtime.build, benchmarks.apps\n"
        "heavy = [m for m in sys.modules if m.startswith(('kubernetes_asyncio', 'kubeserve.schema',"
        " 'pydantic', 'kubeserve.backends'))]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_ray_serve_application_with_metrics_loads_no_schema_or_pydantic() -> None:
    code = (
        "import sys, kubeserve.runtime.replica.server\n"
        "from kubeserve.sdk import ray_namespace\n"
        "ray_namespace.install()\n"
        "from ray import serve\n"
        "from ray.serve import metrics\n"
        "from ray.serve.handle import DeploymentHandle\n"
        "from ray.util.metrics import Counter\n"
        "from ray.exceptions import RayActorError\n"
        "heavy = [m for m in sys.modules if m.startswith(('kubeserve.schema', 'pydantic',"
        " 'kubeserve.compat.ray.serve.driver'))]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_proxy_and_replicas_load_no_prometheus_client_and_the_proxy_no_sdk() -> None:
    """prometheus_client (http.server, email, wsgiref...) is the controller's alone; the proxy
    routes bytes and loads none of the user SDK (only its request context, which logs read)."""
    code = (
        "import sys, kubeserve.runtime.proxy.command, kubeserve.runtime.proxy.server\n"
        "heavy = [m for m in sys.modules if m.startswith(('prometheus_client', 'pydantic',"
        " 'starlette', 'wsproto', 'email')) or m.startswith('kubeserve.sdk.')"
        " and m not in ('kubeserve.sdk.context', 'kubeserve.sdk.multiplex')]\n"
        "assert not heavy, heavy\n"
        "import kubeserve.runtime.replica.server, kubeserve.runtime.build, benchmarks.apps\n"
        "from kubeserve.sdk import ray_namespace\n"
        "ray_namespace.install()\n"
        "from ray.util.metrics import Counter\n"
        "Counter('imports_test').inc()\n"
        "heavy = [m for m in sys.modules if m.startswith(('prometheus_client', 'wsproto',"
        " 'importlib.resources'))]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_processes_that_do_not_trace_load_no_opentelemetry() -> None:
    """tracing_config off (the default): the proxy, a replica and its handle client import
    nothing of OpenTelemetry, so their memory does not grow by it."""
    code = (
        "import sys, kubeserve.runtime.proxy.command, kubeserve.runtime.proxy.server\n"
        "import kubeserve.runtime.replica.server, kubeserve.runtime.handle_client\n"
        "from kubeserve.runtime import tracing\n"
        "assert tracing.setup(None, 'x') is None\n"
        "assert tracing.setup({'enabled': False}, 'x') is None\n"
        "heavy = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
