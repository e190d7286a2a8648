"""Backpressure on one machine: replica limits hold across callers; queues are bounded."""

from __future__ import annotations

import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, slow_app


def test_max_ongoing_requests_holds_across_callers(clean_kubeserve: Kubeserve) -> None:
    """Two Front replicas (two callers, each with its own router) share one Slow replica limited
    to one call at a time: it never runs two."""
    ks = clean_kubeserve
    limited = {"name": "Slow", "num_replicas": 1, "max_ongoing_requests": 1}
    app = slow_app({"name": "Front", "num_replicas": 2}, limited, graph="front")
    assert ks.put([app])[0] == 200
    ks.wait_app("front")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: http("GET", f"{ks.proxy}/front?s=0.3"), range(8)))
    assert [status for status, _ in answers] == [200] * 8, answers
    assert len({body["front_pid"] for _, body in answers}) == 2  # both callers took part
    status, body = http("GET", f"{ks.proxy}/front?peak=1")
    assert (status, body) == (200, {"peak": 1})


def test_max_queued_requests_refuses_at_once(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    limited = {"name": "Slow", "max_ongoing_requests": 1, "max_queued_requests": 1}
    assert ks.put([slow_app(limited)])[0] == 200
    ks.wait_app("slow")
    served_once(ks, "/slow")
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: http("GET", f"{ks.proxy}/slow?s=2")[0], range(6)))
    # one runs, one waits; the other four are refused without waiting for a slot
    assert sorted(answers) == [200, 200, 503, 503, 503, 503], answers
    wait_for(lambda: http("GET", f"{ks.proxy}/slow?s=0")[0] == 200, 30, what="served again")


def test_backpressure_config_sets_the_status_and_retry_after(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    limited = {
        "name": "Slow",
        "max_ongoing_requests": 1,
        "max_queued_requests": 1,
        "backpressure_config": {"status_code": 429, "retry_after_s": 3},
    }
    assert ks.put([slow_app(limited)])[0] == 200
    ks.wait_app("slow")
    served_once(ks, "/slow")

    answers = _four_at_once(f"{ks.proxy}/slow?s=2")
    assert answers == [(200, None), (200, None), (429, "3"), (429, "3")], answers


def test_backpressure_set_in_code_answers_429_with_retry_after(clean_kubeserve: Kubeserve) -> None:
    """The decorator's ``BackpressureConfig(status_code=429, retry_after_s=2.5)``: Ray rounds
    the header up to whole seconds."""
    ks = clean_kubeserve
    app = {"name": "coded", "route_prefix": "/coded", "import_path": "ray_backpressure_app:app"}
    assert ks.put([app])[0] == 200
    ks.wait_app("coded")
    served_once(ks, "/coded")

    answers = _four_at_once(f"{ks.proxy}/coded?s=2")
    assert answers == [(200, None), (200, None), (429, "3"), (429, "3")], answers


def served_once(ks: Kubeserve, route: str) -> None:
    """One quick request through the proxy, answered: from then on the proxy knows the replica.
    (It learns replicas by long-poll, a moment after the application is reported RUNNING; a
    request meanwhile waits in its queue, which these tests fill on purpose.)"""
    assert http("GET", f"{ks.proxy}{route}?s=0")[0] == 200


def _four_at_once(url: str) -> list[tuple[int, str | None]]:
    """Four GETs of ``url`` at once: (status, Retry-After) of each, by status."""

    def get(_: int) -> tuple[int, str | None]:
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                return response.status, None
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("Retry-After")

    with ThreadPoolExecutor(4) as pool:
        return sorted(pool.map(get, range(4)), key=lambda a: a[0])
