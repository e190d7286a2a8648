"""Test support: a real headless Chromium, driven over the Chrome DevTools protocol (CDP).

``make test`` installs Debian's ``chromium`` (``make chromium``) and names it in
``KUBESERVE_CHROMIUM``; without either, :func:`chromium_binary` is ``None`` and browser tests skip.
No browser is downloaded and no driver package is needed: the protocol is JSON over one websocket
(aiohttp's client, already a kubeserve dependency), run on an event loop in a thread so tests stay
synchronous like the rest of the suite.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from support.common import wait_for

_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


def chromium_binary() -> str | None:
    """The Chromium to test with: ``KUBESERVE_CHROMIUM`` (set by ``make test``), else ``chromium``
    on the PATH."""
    return os.environ.get("KUBESERVE_CHROMIUM") or shutil.which("chromium")


class CdpError(AssertionError):
    pass


class Page:
    """One tab, attached with a flat session: evaluate JavaScript, type, screenshot."""

    def __init__(self, browser: Chromium, target_id: str, session_id: str) -> None:
        self._browser = browser
        self.target_id = target_id
        self.session_id = session_id

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self._browser.call(method, params, session_id=self.session_id)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        wait_for(
            lambda: self.evaluate("document.readyState === 'complete' && location.href") == url,
            30,
            what=f"{url} to load",
        )

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises are awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def text(self, selector: str) -> str:
        """The text a user sees in the first element matching ``selector`` ('' if none)."""
        return str(
            self.evaluate(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''")
        )

    def visible(self, selector: str) -> bool:
        return bool(
            self.evaluate(f"!!document.querySelector({json.dumps(selector)})?.checkVisibility()")
        )

    def type_into(self, selector: str, text: str) -> None:
        """Focus ``selector`` and type ``text`` as keyboard input."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (beyond the window's height) at ``path``."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def problems(self) -> list[str]:
        """Uncaught exceptions and Content-Security-Policy violations the page has had."""
        found = []
        for event in self._browser.events(self.session_id):
            if event["method"] == "Runtime.exceptionThrown":
                found.append(json.dumps(event["params"]["exceptionDetails"])[:500])
            elif event["method"] == "Log.entryAdded":
                entry = event["params"]["entry"]
                if entry.get("source") == "security" or "Content Security Policy" in entry.get(
                    "text", ""
                ):
                    found.append(entry["text"])
        return found


class Chromium:
    """A headless Chromium process with its own profile, and a CDP connection to it."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.log_path = workdir / "chromium.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: list[dict[str, Any]] = []
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--headless=new",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-extensions",
            "--window-size=1400,1000",
            f"--user-data-dir={self.workdir / 'profile'}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ]
        if os.geteuid() == 0:  # Chromium's sandbox refuses to run as root
            args.insert(1, "--no-sandbox")
        log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        # Its own process group: the renderers and helpers it forks go with it in stop().
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        url = wait_for(self._devtools_url, 60, 0.1, what="Chromium's DevTools endpoint")
        self._thread.start()
        self._run(self._connect(url))

    def _devtools_url(self) -> str | None:
        assert self.proc is not None
        found = _LISTENING.search(self.log_path.read_bytes())
        if found is None and self.proc.poll() is not None:
            raise AssertionError(f"chromium exited: {self.log_path.read_text(errors='replace')}")
        return found.group(1).decode() if found else None

    def _run(self, coroutine: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _connect(self, url: str) -> None:
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._loop.create_task(self._read())

    async def _read(self) -> None:
        assert self._ws is not None
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            future = self._pending.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self._events.append(data)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(CdpError("the DevTools connection closed"))

    async def _call(
        self, method: str, params: dict[str, Any], session_id: str | None
    ) -> dict[str, Any]:
        assert self._ws is not None
        message_id = next(self._ids)
        future = self._loop.create_future()
        self._pending[message_id] = future
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session_id:
            message["sessionId"] = session_id
        await self._ws.send_str(json.dumps(message))
        return await future

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session_id: str | None = None
    ) -> dict[str, Any]:
        """One CDP command; its result, or :class:`CdpError` with the browser's error."""
        answer = self._run(self._call(method, params or {}, session_id))
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        return dict(answer.get("result", {}))

    def events(self, session_id: str) -> list[dict[str, Any]]:
        return [e for e in list(self._events) if e.get("sessionId") == session_id]

    def new_page(self) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        page = Page(self, target, session["sessionId"])
        for domain in ("Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        return page

    def stop(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self.call("Browser.close")
            with contextlib.suppress(Exception):
                self._run(self._close(), timeout=10)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    async def _close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()


@contextlib.contextmanager
def running_chromium(binary: str, workdir: Path) -> Iterator[Chromium]:
    browser = Chromium(binary, workdir)
    try:
        browser.start()
        yield browser
    finally:
        browser.stop()
