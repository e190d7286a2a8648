"""The operator's Prometheus metrics (``kubeserve operator --metrics-port``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubeserve.runtime.metrics import label_value
from kubeserve.schema.resources import ServeApplicationStatus


def metrics_text(
    reconciles: int, reconcile_errors: int, api_requests: int, applications: list[dict[str, Any]]
) -> str:
    """Prometheus text exposition of the operator's counters and application statuses."""
    statuses = Counter(
        str(ServeApplicationStatus.of(app).app_status or "NOT_STARTED") for app in applications
    )
    lines = [
        "# HELP kubeserve_operator_reconciles_total Reconcile passes over custom resources.",
        "# TYPE kubeserve_operator_reconciles_total counter",
        f"kubeserve_operator_reconciles_total {reconciles}",
        "# HELP kubeserve_operator_reconcile_errors_total Reconcile passes that failed.",
        "# TYPE kubeserve_operator_reconcile_errors_total counter",
        f"kubeserve_operator_reconcile_errors_total {reconcile_errors}",
        "# HELP kubeserve_operator_api_requests_total Kubernetes API requests of the operator's"
        " own client (kopf's are not counted).",
        "# TYPE kubeserve_operator_api_requests_total counter",
        f"kubeserve_operator_api_requests_total {api_requests}",
        "# HELP kubeserve_applications ServeApplications watched by the operator, by status.",
        "# TYPE kubeserve_applications gauge",
    ]
    lines += [
        f'kubeserve_applications{{status="{label_value(s)}"}} {n}'
        for s, n in sorted(statuses.items())
    ]
    return "\n".join(lines) + "\n"
