"""The dashboard in a real headless Chromium against a real ``kubeserve start``: what a user sees
when an application is deployed, when a replica dies and is replaced, when it is scaled, and when
the admin API needs a token. Screenshots go to ``test-output/dashboard/`` (ignored by git;
``KUBESERVE_TEST_OUTPUT`` moves it); their paths are printed (``pytest -s``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from kubeserve.api.server import create_app
from kubeserve.backends.protocol import Backend, Namespaces, NotFoundError
from kubeserve.schema.status import (
    APIType,
    ApplicationDetails,
    ApplicationStatus,
    ServeInstanceDetails,
)
from support.browser import Chromium, Page, chromium_binary, running_chromium
from support.common import ROOT, free_port, http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve

CHROMIUM = chromium_binary()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is installed by `make test` (make chromium)"
)

SCREENSHOTS = Path(os.environ.get("KUBESERVE_TEST_OUTPUT", ROOT / "test-output")) / "dashboard"
TOKEN = "dashboard-t0ken"
HELLO = {"name": "hello", "route_prefix": "/hello", "import_path": "examples.hello:app"}


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    assert CHROMIUM is not None
    with running_chromium(CHROMIUM, tmp_path_factory.mktemp("chromium")) as browser:
        yield browser


@pytest.fixture
def page(chromium: Chromium) -> Iterator[Page]:
    tab = chromium.new_page()
    yield tab
    assert not tab.problems(), "the page had script errors or CSP violations"
    chromium.call("Target.closeTarget", {"targetId": tab.target_id})


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = page.screenshot(SCREENSHOTS / name)
    print(f"dashboard screenshot: {path}")
    return path


def cell(page: Page, selector: str, attribute: str) -> str | None:
    value = page.evaluate(
        f"document.querySelector({selector!r})?.getAttribute({attribute!r}) ?? null"
    )
    return None if value is None else str(value)


def replica_pids_on_page(page: Page) -> list[int]:
    pids = page.evaluate(
        '[...document.querySelectorAll(\'#replicas tr[data-app="hello"][data-state="RUNNING"]\')]'
        ".map(tr => tr.dataset.pid)"
    )
    return sorted(int(pid) for pid in pids if pid)


def test_page_follows_an_application_and_a_replica_replaced(
    clean_kubeserve: Kubeserve, page: Page
) -> None:
    ks = clean_kubeserve
    page.navigate(f"{ks.api}/")
    wait_for(lambda: page.visible("#no-apps"), 30, what="the page to show no application")
    assert not page.visible("#login"), "no token is configured: the page must not ask for one"

    status, body = ks.put([HELLO])
    assert status == 200, body
    wait_for(
        lambda: cell(page, '#applications tr[data-app="hello"]', "data-status") == "RUNNING",
        90,
        what="hello to show as RUNNING",
    )
    assert "/hello" in page.text('#applications tr[data-app="hello"]')
    wait_for(
        lambda: cell(page, '#deployments tr[data-app="hello"]', "data-running") == "1",
        30,
        what="the deployment to show 1 running replica",
    )
    pids = wait_for(lambda: replica_pids_on_page(page), 30, what="a RUNNING replica row")
    assert pids == ks.replica_pids("hello", "Hello")
    assert "application hello: " in page.text("#events")
    screenshot(page, "dashboard-running.png")

    (old,) = pids
    os.kill(old, signal.SIGKILL)
    wait_for(
        lambda: (now := replica_pids_on_page(page)) and old not in now,
        90,
        what=f"the page to show a replica replacing pid {old}",
    )
    events = page.text("#events")
    assert f"(pid {old}): RUNNING → gone" in events, events
    assert "1 / 1" in page.text('#deployments tr[data-app="hello"]')
    metrics_status, _ = http("GET", f"{ks.api}/metrics")
    if metrics_status == 404:  # the server has no metrics: the page says so, with no numbers
        assert "metrics not available" in page.text("#metrics-status")
        assert not page.visible("#metrics")
    else:  # kubeserve start: the page shows the proxy's counts of the route
        for _ in range(3):
            assert http("GET", f"{ks.proxy}/hello")[0] == 200
        wait_for(
            lambda: page.visible('#metrics tr[data-route="/hello"]'),
            60,
            what="the page to show the request rates of /hello",
        )
    screenshot(page, "dashboard-replaced.png")

    status, body = ks.put([{**HELLO, "deployments": [{"name": "Hello", "num_replicas": 2}]}])
    assert status == 200, body
    (replacement,) = replica_pids_on_page(page)
    both = wait_for(
        lambda: pids if len(pids := replica_pids_on_page(page)) == 2 else None,
        90,
        what="the page to show two RUNNING replicas",
    )
    assert "2 / 2" in page.text('#deployments tr[data-app="hello"]')
    (added,) = set(both) - {replacement}
    assert f"(pid {added}): " in page.text("#events")
    screenshot(page, "dashboard-scaled.png")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    with running_kubeserve(tmp_path_factory.mktemp("secured"), token=TOKEN) as server:
        yield server


def test_page_asks_for_the_token_and_keeps_it_in_the_tab(secured: Kubeserve, page: Page) -> None:
    page.navigate(f"{secured.api}/")
    wait_for(lambda: page.visible("#login"), 30, what="the page to ask for a token")
    assert not page.visible("#content")
    screenshot(page, "dashboard-login.png")

    page.type_into("#token", "not-the-token")
    page.click("#login-form button")
    wait_for(lambda: "not the one" in page.text("#login-error"), 30, what="the wrong token refused")
    assert page.evaluate("sessionStorage.length") == 0, "a refused token must not be kept"

    page.type_into("#token", TOKEN)
    page.click("#login-form button")
    wait_for(lambda: page.visible("#no-apps"), 30, what="the page after signing in")
    assert page.evaluate("sessionStorage.getItem('kubeserve.token')") == TOKEN
    assert page.evaluate("document.cookie") == ""
    page.navigate(f"{secured.api}/")  # a reload keeps the tab's token
    wait_for(lambda: page.visible("#no-apps"), 30, what="the page after a reload")
    assert not page.visible("#login")

    page.click("#sign-out")
    wait_for(lambda: page.visible("#login"), 30, what="the token forgotten")
    assert page.evaluate("sessionStorage.length") == 0


# ------------------------------------------------- an admin API in this process, state chosen


class _FixedBackend:
    """An admin API backend whose instance is ``details``, whatever happens."""

    def __init__(
        self, details: ServeInstanceDetails, metrics: Callable[[], str] | None = None
    ) -> None:
        self.details = details
        self._metrics = metrics

    async def metrics(self) -> bytes | None:
        return None if self._metrics is None else self._metrics().encode()

    def internal_routes(self) -> list[web.RouteDef]:
        return []

    async def instance_details(self) -> ServeInstanceDetails:
        return self.details.model_copy(deep=True)


NOTHING_DEPLOYED = ServeInstanceDetails(proxies={}, applications={})


@contextlib.contextmanager
def in_process_admin_api(
    details: ServeInstanceDetails,
    metrics: Callable[[], str] | None = None,
    namespaces: Namespaces | None = None,
) -> Iterator[str]:
    """The admin API (:func:`create_app`) of an instance that is ``details`` and whose
    ``GET /metrics`` is ``metrics()`` (a 404 without), and of ``namespaces``, served from a
    thread; yields its URL."""
    app = create_app(_FixedBackend(details, metrics), namespaces=namespaces)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    port = free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


# ---------------------------------------------------------------------- rates and latency

RATE = 20.0  # requests per second the metrics below count
LABELS = 'application="hello",route="/hello",method="GET"'


def _prometheus_text(started: float) -> str:
    """Ray Serve's HTTP metrics of a route that served RATE requests a second since ``started``,
    one in ten an error, each taking between 10 and 30 ms (20 ms on average)."""
    n = RATE * (time.monotonic() - started)
    latency = "ray_serve_http_request_latency_ms"
    return "\n".join(
        (
            "# TYPE ray_serve_num_http_requests_total counter",
            f'ray_serve_num_http_requests_total{{{LABELS},status_code="200"}} {n * 0.9}',
            f'ray_serve_num_http_requests_total{{{LABELS},status_code="500"}} {n * 0.1}',
            "# TYPE ray_serve_num_http_error_requests_total counter",
            f'ray_serve_num_http_error_requests_total{{{LABELS},error_code="500"}} {n * 0.1}',
            f"# TYPE {latency} histogram",
            f'{latency}_bucket{{{LABELS},le="10.0"}} 0.0',
            f'{latency}_bucket{{{LABELS},le="30.0"}} {n}',
            f'{latency}_bucket{{{LABELS},le="+Inf"}} {n}',
            f"{latency}_sum{{{LABELS}}} {20 * n}",
            f"{latency}_count{{{LABELS}}} {n}",
            "",
        )
    )


def test_rates_and_latency_come_from_the_metrics(page: Page) -> None:
    started = time.monotonic()
    with in_process_admin_api(NOTHING_DEPLOYED, lambda: _prometheus_text(started)) as api:
        page.navigate(f"{api}/")
        row = '#metrics tr[data-route="/hello"]'

        def rates() -> list[str] | None:
            cells = page.evaluate(
                f"[...(document.querySelector({row!r})?.cells ?? [])].map(c => c.innerText)"
            )
            return cells if cells and cells[2] != "\u2013" else None

        cells = wait_for(rates, 30, what="a request rate on the page")
        application, route, per_second, errors, mean, p95, _total = cells
        assert (application, route) == ("hello", "/hello")
        assert 0.6 * RATE < float(per_second) < 1.4 * RATE, cells
        assert 0.06 * RATE < float(errors) < 0.14 * RATE, cells
        assert mean == "20.0 ms", cells
        assert p95 == "29.0 ms", cells  # 10 + 0.95 * (30 - 10), as histogram_quantile says
        assert not page.visible("#metrics-status")
        screenshot(page, "dashboard-metrics.png")


# ------------------------------------------------------------------- deployers' text is text

HOSTILE = '<img src=x onerror="window.injected=1"><b>bold</b>'


def test_names_and_messages_are_shown_as_text_never_run(page: Page) -> None:
    details = ServeInstanceDetails.model_validate(
        {
            "proxies": {},
            "applications": {
                "app": {
                    "name": "app",
                    "route_prefix": "/app",
                    "docs_path": None,
                    "status": "DEPLOY_FAILED",
                    "message": HOSTILE,
                    "last_deployed_time_s": time.time(),
                    "source": "declarative",
                    "deployments": {},
                    "external_scaler_enabled": False,
                }
            },
        }
    )
    with in_process_admin_api(details) as api:
        page.navigate(f"{api}/")
        row = '#applications tr[data-app="app"]'
        wait_for(lambda: HOSTILE in page.text(row), 30, what="the message shown as written")
        assert page.evaluate(f"document.querySelector({row!r}).querySelector('img, b')") is None
        assert page.evaluate("window.injected === undefined")


# ---------------------------------------------------------------------- namespaces


def _one_app(name: str) -> ServeInstanceDetails:
    app = ApplicationDetails(
        name=name,
        route_prefix=f"/{name}",
        docs_path=None,
        status=ApplicationStatus.RUNNING,
        message="",
        last_deployed_time_s=1700000000.0,
        source=APIType.DECLARATIVE,
        deployments={},
        external_scaler_enabled=False,
    )
    return ServeInstanceDetails(proxies={}, applications={name: app})


class _TwoNamespaces:
    """``ops`` (the bare paths') and ``team-a``, each with one application named after it."""

    own = "ops"

    def __init__(self) -> None:
        self._backends = {name: _FixedBackend(_one_app(name)) for name in ("ops", "team-a")}

    def backend(self, namespace: str) -> Backend:
        if namespace not in self._backends:
            raise NotFoundError(f'namespace "{namespace}" is not served here')
        return self._backends[namespace]  # type: ignore[return-value]

    def names(self) -> list[str]:
        return sorted(self._backends)


def test_the_picker_moves_between_namespaces(page: Page) -> None:
    namespaces = _TwoNamespaces()
    with in_process_admin_api(_one_app("ops"), namespaces=namespaces) as api:
        page.navigate(f"{api}/")
        shown = 'document.querySelector("#applications tr[data-app]")?.dataset.app ?? null'
        assert wait_for(lambda: page.evaluate(shown), 30, what="the own namespace's app") == "ops"
        wait_for(lambda: page.visible("#namespace-picker"), 30, what="the namespace picker")
        options = page.evaluate(
            '[...document.querySelectorAll("#namespace option")].map(o => o.value)'
        )
        assert options == ["ops", "team-a"]
        assert page.evaluate('document.querySelector("#namespace").value') == "ops"
        page.evaluate(
            'const s = document.querySelector("#namespace"); s.value = "team-a";'
            ' s.dispatchEvent(new Event("change"))'
        )
        wait_for(lambda: page.evaluate("location.pathname") == "/namespaces/team-a/", 30)
        wait_for(lambda: page.evaluate(shown) == "team-a", 30, what="team-a's application")
        # The picker is filled after the first applications reading is drawn: wait for it.
        wait_for(
            lambda: page.evaluate('document.querySelector("#namespace").value') == "team-a",
            30,
            what="the picker showing team-a",
        )
        screenshot(page, "namespace-team-a.png")

        # A namespace not served: the page says why, from the API's answer.
        page.navigate(f"{api}/namespaces/team-b/")
        wait_for(lambda: page.visible("#error"), 30, what="the error of an unknown namespace")
        assert 'namespace "team-b" is not served here' in page.text("#error")
