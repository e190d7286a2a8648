"""Ray Serve's metrics of this process (``runtime.metrics``): label values written so that every
reader of the Prometheus text format reads them back, and a bounded number of series per metric."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kubeserve.runtime.metrics import (
    LATENCY_BUCKETS_MS,
    MAX_SERIES_PER_METRIC,
    OVERFLOW,
    ReplicaMetrics,
    exposition,
    label_value,
)
from kubeserve.runtime.replica.tally import PyTally
from kubeserve.runtime.wire import parse_metrics

AWKWARD = 'a\\b"c\nd\re'
#: what a reader gets back: a carriage return has no escape in the format, so it is written as
#: the text backslash-r
READ_BACK = 'a\\b"c\nd\\re'


def samples(name: str) -> list[tuple[dict[str, str], float]]:
    text = exposition().decode()
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def test_label_values_escape_backslash_quote_line_feed_and_carriage_return() -> None:
    assert label_value(AWKWARD) == 'a\\\\b\\"c\\nd\\\\re'
    assert label_value("plain /route-1") == "plain /route-1"
    line = f'kubeserve_replica_ongoing_requests{{app="{label_value(AWKWARD)}",x="y"}} 3\n'
    assert "\r" not in line and line.count("\n") == 1
    (family,) = text_string_to_metric_families(line)
    (sample,) = family.samples
    assert sample.labels == {"app": READ_BACK, "x": "y"}
    assert parse_metrics(line) == {"kubeserve_replica_ongoing_requests": 3.0}


def test_rays_metrics_write_awkward_names_on_one_line_each() -> None:
    tally = PyTally(LATENCY_BUCKETS_MS)
    metrics = ReplicaMetrics(AWKWARD, "Awkward", "awkward-1", lambda: 0, tally.take_metrics)
    tally.done(0.0, 0.003, "/awkward")
    metrics.flush()
    text = exposition().decode()
    assert "\r" not in text
    assert [
        value
        for labels, value in samples("ray_serve_deployment_request_counter_total")
        if labels["deployment"] == "Awkward"
    ] == [1.0]
    (labels,) = (
        labels
        for labels, _ in samples("ray_serve_deployment_request_counter_total")
        if labels["deployment"] == "Awkward"
    )
    assert labels["application"] == READ_BACK


def test_a_metric_holds_a_bounded_number_of_series_and_counts_the_overflow() -> None:
    metrics = ReplicaMetrics("bounded", "Bounded", "bounded-1", lambda: 0, list)
    extra = 25
    for i in range(MAX_SERIES_PER_METRIC + extra):  # a new exception class each time
        metrics.error("/bounded", type(f"Error{i}", (Exception,), {})())
    errors = samples("ray_serve_deployment_error_counter_total")
    assert len(errors) == MAX_SERIES_PER_METRIC + 1
    (overflowed,) = (value for labels, value in errors if labels["exception_type"] == OVERFLOW)
    (overflow_labels,) = (labels for labels, _ in errors if labels["application"] == OVERFLOW)
    assert set(overflow_labels.values()) == {OVERFLOW}
    assert overflowed >= extra  # (series other tests of this process made count too)
    (writes,) = (
        value
        for labels, value in samples("kubeserve_metric_series_overflow_total")
        if labels["metric"] == "ray_serve_deployment_error_counter"
    )
    assert writes == overflowed
    # a label set that had its series keeps it
    metrics.error("/bounded", type("Error0", (Exception,), {})())
    assert samples("kubeserve_metric_series_overflow_total") == [
        ({"metric": "ray_serve_deployment_error_counter"}, writes)
    ]
