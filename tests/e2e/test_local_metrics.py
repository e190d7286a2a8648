"""``GET /metrics`` of ``kubeserve start``: Ray Serve's metric names and labels, real counts.

Requests go through the real proxy to real replicas; the admin API merges what every process of
the instance wrote (prometheus_client's multiprocess mode); the exposition is read with
prometheus_client's own parser, as Prometheus would.
"""

from __future__ import annotations

import random
import string
from http.client import HTTPConnection
from typing import Any

from kubeserve.runtime.metrics import OTHER_METHOD
from support.common import http, wait_for
from support.kubeserve_start import Kubeserve
from support.metrics_scrape import scrape, value

ECHO = {"name": "echo", "route_prefix": "/echo", "import_path": "ks_echo_app:app"}


def test_requests_errors_and_latency_are_counted_with_rays_names(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    assert ks.put([ECHO])[0] == 200
    ks.wait_app("echo")
    for _ in range(5):
        assert http("GET", f"{ks.proxy}/echo/str")[0] == 200
    for _ in range(2):
        assert http("GET", f"{ks.proxy}/echo/boom")[0] == 500
    assert http("GET", f"{ks.proxy}/nowhere")[0] == 404

    ok = {"route": "/echo", "application": "echo", "method": "GET"}
    replica = {"application": "echo", "deployment": "Echo", "route": "/echo"}
    # each process flushes what it recorded every half second (the native data path hands the
    # proxy what it answered once a second)
    samples = wait_for(
        lambda: (
            (s := scrape(ks))
            and value(s, "ray_serve_num_http_requests_total", status_code="404", route="") == 1
            and value(s, "ray_serve_num_http_requests_total", status_code="200", **ok) == 5
            and value(s, "ray_serve_num_http_requests_total", status_code="500", **ok) == 2
            and value(s, "ray_serve_deployment_request_counter_total", **replica) == 7
            and s
        ),
        10,
        what="the proxy's and the replica's counts in /metrics",
    )
    assert value(samples, "ray_serve_num_http_requests_total", status_code="200", **ok) == 5
    assert value(samples, "ray_serve_num_http_requests_total", status_code="404", route="") == 1
    assert value(samples, "ray_serve_num_http_error_requests_total", error_code="500", **ok) == 2
    assert (
        value(
            samples,
            "ray_serve_num_deployment_http_error_requests_total",
            deployment="Echo",
            error_code="500",
            **ok,
        )
        == 2
    )
    latency = "ray_serve_http_request_latency_ms"
    assert value(samples, f"{latency}_count", status_code="200", **ok) == 5
    assert value(samples, f"{latency}_bucket", status_code="200", le="+Inf", **ok) == 5
    assert value(samples, f"{latency}_bucket", status_code="200", le="600000.0", **ok) == 5

    assert (
        value(
            samples,
            "ray_serve_deployment_error_counter_total",
            exception_type="ValueError",
            **replica,
        )
        == 2
    )
    assert value(samples, "ray_serve_deployment_processing_latency_ms_count", **replica) == 7
    replicas = len(ks.replica_pids("echo", "Echo"))
    assert (
        value(samples, "ray_serve_deployment_replica_starts_total", deployment="Echo") == replicas
    )
    assert value(samples, "ray_serve_replica_processing_queries", deployment="Echo") == 0
    assert value(samples, "ray_serve_num_ongoing_http_requests") == 0


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def send_random_paths(ks: Kubeserve, count: int, seed: int) -> None:
    """``count`` requests for paths nobody configured, half under the proxy's own ``/-/``, some
    with methods outside :data:`METHOD_LABELS`, over one keep-alive connection (each a 404)."""
    rng = random.Random(seed)
    conn = HTTPConnection("127.0.0.1", ks.proxy_port, timeout=10)
    try:
        for i in range(count):
            token = "".join(rng.choices(string.ascii_letters + string.digits, k=16))
            path = f"/-/{token}" if i % 2 else f"/{token}/{i}"
            conn.request(rng.choice(("GET", "POST", "DELETE", "PROPFIND", "M-SEARCH")), path)
            response = conn.getresponse()
            response.read()
            assert response.status == 404, (path, response.status)
    finally:
        conn.close()


def test_random_paths_add_no_series_and_no_memory(clean_kubeserve: Kubeserve) -> None:
    """Paths come from clients: a scan of random ones must neither add a ``route`` label value
    per path (Ray labels every unmatched request ``route=""``) nor grow the proxy."""
    ks = clean_kubeserve
    assert ks.put([ECHO])[0] == 200
    ks.wait_app("echo")
    (proxy_pid,) = (int(p["worker_id"]) for p in ks.details()["proxies"].values())
    assert http("GET", f"{ks.proxy}/echo/str")[0] == 200
    # its series in /metrics before the first count (the native data path records late)
    wait_for(
        lambda: value(scrape(ks), "ray_serve_num_http_requests_total", status_code="200") >= 1,
        10,
        what="the 200 in /metrics",
    )
    # the module's instance may have answered 404s before this test: count from where it is
    earlier = value(scrape(ks), "ray_serve_num_http_requests_total", status_code="404")
    send_random_paths(ks, 1000, seed=1)  # every label set of a 404 seen once; allocator warm

    def flushed(total: float) -> dict[str, Any] | None:
        samples = scrape(ks)
        counted = value(samples, "ray_serve_num_http_requests_total", status_code="404")
        if counted != total:
            return None
        found: dict[str, set[tuple[tuple[str, str], ...]]] = {}
        for name, labelled in samples.items():
            # the proxy's series only: a 404 never reaches a replica, whose series (of the
            # request above) may reach /metrics after the first scrape
            if name.startswith("ray_serve_deployment_"):
                continue
            found.setdefault(name, set()).update(tuple(sorted(ls.items())) for ls, _ in labelled)
        return found

    before = wait_for(lambda: flushed(earlier + 1000), 10, what="the 404s in /metrics")
    rss_before = _rss_kib(proxy_pid)
    send_random_paths(ks, 5000, seed=2)
    after = wait_for(lambda: flushed(earlier + 6000), 10, what="the 404s in /metrics")
    rss_after = _rss_kib(proxy_pid)

    routes = {dict(labels).get("route") for s in after.values() for labels in s}
    assert routes <= {None, "", "/echo", "/-/healthz", "/-/routes"}, sorted(r for r in routes if r)[
        :5
    ]
    methods = {dict(labels).get("method") for s in after.values() for labels in s}
    assert methods == {None, "GET", "POST", "DELETE", OTHER_METHOD}
    assert {name: len(s) for name, s in after.items()} == {
        name: len(s) for name, s in before.items()
    }
    assert rss_after - rss_before < 8 * 1024, (rss_before, rss_after)


def test_custom_metrics_of_ray_serve_metrics_reach_metrics_with_serve_tags(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    app = {"name": "custom", "route_prefix": "/custom", "import_path": "ray_custom_metrics_app:app"}
    assert ks.put([app])[0] == 200
    ks.wait_app("custom")
    (pid,) = ks.replica_pids("custom", "Counted")
    for _ in range(5):
        assert http("GET", f"{ks.proxy}/custom")[0] == 200
    samples = wait_for(
        lambda: (s := scrape(ks)) and value(s, "ray_my_counter_total") == 3 and s,
        10,
        what="the custom counter in /metrics",
    )
    (labels,) = [labels for labels, _ in samples["ray_my_counter_total"]]
    replica = labels["replica"]
    assert replica  # the replica's id, as serve.get_replica_context().replica_tag says
    assert labels == {
        "deployment": "Counted",
        "replica": replica,
        "application": "custom",
        "model": "123",
    }
    serve_tags = {"deployment": "Counted", "replica": replica, "application": "custom"}
    histogram = "ray_my_histogram_ms"
    assert value(samples, f"{histogram}_count", route="/custom", **serve_tags) == 5
    assert value(samples, f"{histogram}_bucket", le="64.0", route="/custom", **serve_tags) == 5
    assert value(samples, "ray_my_requests_seen", **serve_tags) == 5
    # ray.util.metrics adds no Serve tags: only the metric's own
    assert samples["ray_my_plain_counter_total"] == [({"kind": "plain"}, 10.0)]
    assert pid in ks.replica_pids("custom", "Counted")
