"""What a process does with a ``tracing_config`` it cannot apply: a clear error naming the field,
before any span (kubeserve start also refuses it at PUT, see ``test_local_tracing``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ks_tracing_exporter import SPANS_DIR_ENV

from kubeserve.runtime import tracer, tracing
from support.common import ROOT


def test_an_exporter_that_does_not_import_or_returns_no_processors_is_an_error() -> None:
    cases = {
        "no_such_module_here:exporter": "does not import",
        "ks_tracing_exporter:no_such_function": "does not import",
        "ks_tracing_exporter:not_a_processor": "returned str",
        "ks_tracing_exporter:SPANS_DIR_ENV": "is not a function",
    }
    for path, words in cases.items():
        with pytest.raises(tracing.TracingSetupError, match=words):
            tracing.setup({"enabled": True, "exporter_import_path": path}, "test")
    assert tracing.ACTIVE is None


def test_what_kubeserve_start_checks_at_put_runs_none_of_the_users_code() -> None:
    path = list(sys.path)
    assert tracer.unavailable(None, path) is None
    assert tracer.unavailable({"enabled": False, "exporter_import_path": "nope:x"}, path) is None
    assert tracer.unavailable({"enabled": True}, path) is None
    found = {"enabled": True, "exporter_import_path": "ks_tracing_exporter:exporter"}
    assert tracer.unavailable(found, path) is None
    missing = {"enabled": True, "exporter_import_path": "no_such_package.sub:exporter"}
    field, reason = tracer.unavailable(missing, path) or ("", "")
    assert field == "exporter_import_path"
    assert "no module named 'no_such_package'" in reason
    # OpenTelemetry itself missing from the data plane's path
    field, reason = tracer.unavailable({"enabled": True}, ["/nonexistent"]) or ("", "")
    assert field == "enabled" and "kubeserve[tracing]" in reason


def test_user_code_reads_its_replica_span_as_rays_get_trace_context(tmp_path: Path) -> None:
    """``ray.serve.get_trace_context()``: None where the process does not trace; inside a
    replica call of a tracing process, the context holding the call's span (a process of its
    own: OpenTelemetry's provider is process-wide)."""
    code = (
        "from kubeserve.sdk import ray_namespace\n"
        "ray_namespace.install()\n"
        "from ray import serve\n"
        "from kubeserve.runtime import tracing\n"
        "assert serve.get_trace_context() is None\n"
        "tracer = tracing.setup({'enabled': True, 'sampling_ratio': 1.0,"
        " 'exporter_import_path': 'ks_tracing_exporter:exporter'}, 'test')\n"
        "config = {'app': 'a', 'deployment': 'D', 'replica_id': 'r1'}\n"
        "from opentelemetry import trace\n"
        "with tracer.inside(tracer.replica_call(config, 'f', 'req-1', None)) as span:\n"
        "    assert trace.get_current_span(serve.get_trace_context()) is span\n"
        "assert not trace.get_current_span().get_span_context().is_valid\n"
    )
    apps = str(ROOT / "tests" / "apps")
    env = {**os.environ, SPANS_DIR_ENV: str(tmp_path), "PYTHONPATH": apps}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)
    (written,) = tmp_path.glob("*.jsonl")
    span = json.loads(written.read_text())
    assert span["name"] == "replica_handle_request D f"
    assert span["attributes"]["request_id"] == "req-1"


def test_a_proxy_that_cannot_trace_as_asked_exits_saying_why_in_one_last_line() -> None:
    """As Ray's proxy, whose constructor raises: it does not serve without the tracing asked
    for. Its last line (a pod's termination message, which the operator reports in the
    ServeInstance's status) names the field, with no usage text before it."""
    config = {"enabled": True, "exporter_import_path": "ks_tracing_exporter:nowhere"}
    command = [sys.executable, "-m", "kubeserve.cli", "proxy", "--controller-url", "http://x"]
    apps = str(ROOT / "tests" / "apps")
    proc = subprocess.run(
        [*command, "--tracing-config", json.dumps(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": apps},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "kubeserve proxy: tracing_config.exporter_import_path: exporter_import_path "
        "'ks_tracing_exporter:nowhere' does not import: "
        "AttributeError: module 'ks_tracing_exporter' has no attribute 'nowhere'"
    ]
