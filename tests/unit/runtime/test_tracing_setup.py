"""What a process does with a ``tracing_config`` it cannot apply: a clear error naming the field,
before any span (kubeserve start also refuses it at PUT, see ``test_local_tracing``)."""

from __future__ import annotations

import sys

import pytest

from kubeserve.runtime import tracer, tracing


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
