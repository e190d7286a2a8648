"""The operator's Prometheus metrics (``kubeserve operator --metrics-port``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubeserve.runtime.kubernetes.client import RequestCounts
from kubeserve.runtime.metrics import label_value
from kubeserve.schema.resources import ServeApplicationStatus


def metrics_text(
    reconciles: int,
    reconcile_errors: int,
    api: RequestCounts,
    leading: bool,
    applications: list[dict[str, Any]],
    resyncs_skipped: int = 0,
    leader_terms: int = 0,
    fence_shuts: int = 0,
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
        "# HELP kubeserve_operator_resyncs_skipped_total Periodic resyncs skipped: nothing the"
        " pass reads had changed since the last one.",
        "# TYPE kubeserve_operator_resyncs_skipped_total counter",
        f"kubeserve_operator_resyncs_skipped_total {resyncs_skipped}",
        "# HELP kubeserve_operator_api_requests_total Kubernetes API requests of the operator's"
        " own client (kopf's are not counted).",
        "# TYPE kubeserve_operator_api_requests_total counter",
        f"kubeserve_operator_api_requests_total {api.requests}",
        "# HELP kubeserve_operator_api_writes_total Kubernetes API requests of the operator's"
        " own client that change something (the admin API's included; leader election's not).",
        "# TYPE kubeserve_operator_api_writes_total counter",
        f"kubeserve_operator_api_writes_total {api.writes}",
        "# HELP kubeserve_operator_leader 1 while this replica of the operator reconciles.",
        "# TYPE kubeserve_operator_leader gauge",
        f"kubeserve_operator_leader {int(leading)}",
        "# HELP kubeserve_operator_leader_terms_total Terms of leadership this replica started.",
        "# TYPE kubeserve_operator_leader_terms_total counter",
        f"kubeserve_operator_leader_terms_total {leader_terms}",
        "# HELP kubeserve_operator_fence_shut_total Times this replica's writes paused for a"
        " late renewal of the Lease (counted when the pause ended: renewed, or the term over).",
        "# TYPE kubeserve_operator_fence_shut_total counter",
        f"kubeserve_operator_fence_shut_total {fence_shuts}",
        "# HELP kubeserve_applications ServeApplications watched by the operator, by status.",
        "# TYPE kubeserve_applications gauge",
    ]
    lines += [
        f'kubeserve_applications{{status="{label_value(s)}"}} {n}'
        for s, n in sorted(statuses.items())
    ]
    return "\n".join(lines) + "\n"
