"""``kubeserve policy-host``: an application's custom autoscaling policies behind the data plane's
authenticated channel, for a controller that must not run user code itself (the Kubernetes
operator; the local backend talks to :mod:`kubeserve.runtime.autoscaling_policy` over pipes).

The process runs in the application's image and environment (a pod of its own on Kubernetes,
with the replicas' ``working_dir`` delivery) and answers one endpoint,
``POST`` :data:`~kubeserve.runtime.wire.AUTOSCALING_POLICY_PATH`: the body is one request of
:mod:`kubeserve.runtime.autoscaling_policy`'s protocol, the 200 answer its answer. Every
connection must pass the replicas' handshake (:mod:`kubeserve.runtime.channel`: the instance's
data-plane secret, this process's identity) in the ``CONTROL`` role; anything else is cut off
before a byte is parsed, so only the instance's own controller can ask.

One decision at a time, in a worker thread (the loop keeps answering handshakes). A policy that
does not answer within :data:`CALL_TIMEOUT_S` (:data:`FIRST_CALL_TIMEOUT_S` for the first, which
imports the policy) cannot be interrupted in its thread: the caller gets the error and the
process exits, so its supervisor (the pod's kubelet) starts a fresh one, as the local backend
kills and restarts a hung policy process. ``policy_state`` lives in this process: a restart
loses it, as Ray loses it when its controller restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubeserve.runtime import channel, wire
from kubeserve.runtime.autoscaling_policy import PolicyHost, answer
from kubeserve.runtime.build import (
    load_application,
    load_pickled_application,
    prepare_for_user_code,
)
from kubeserve.runtime.http1 import local_response
from kubeserve.sdk.application import Application

__all__ = ["CALL_TIMEOUT_S", "FIRST_CALL_TIMEOUT_S", "PolicyServer", "main"]

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
FIRST_CALL_TIMEOUT_S = 60.0
#: Longest request head and body read (a request holds a few numbers per deployment).
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 4 * 1024 * 1024
_READ_TIMEOUT_S = 10.0
#: Exit status after a policy hung (the supervisor restarts the process).
HUNG_EXIT_CODE = 3


class PolicyServer:
    """Serves one :class:`PolicyHost` over the authenticated channel."""

    def __init__(self, host: PolicyHost, secret: bytes, identity: str) -> None:
        self._host = host
        self._secret = secret
        self._identity = identity
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="policy")
        self._lock = asyncio.Lock()
        self._answered = False

    def connection(self) -> asyncio.Protocol:
        """The protocol of one accepted connection (the handshake comes first)."""
        return channel.ServerChannel(self._secret, self._identity, self._after_handshake, log)

    def _after_handshake(self, role: channel.Role) -> asyncio.Protocol:
        reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES)
        return asyncio.StreamReaderProtocol(reader, lambda r, w: self._handle(role, r, w))

    async def _handle(
        self, role: channel.Role, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S):
                request = await _read_request(reader)
            status, body = await self._respond(role, *request)
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            status, body = 400, f"bad request: {exc}".encode()
        except TimeoutError:
            status, body = 408, b"request not received in time"
        content_type = b"application/json" if status == 200 else b"text/plain; charset=utf-8"
        try:
            writer.write(local_response(status, body, content_type=content_type, close=True))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _respond(
        self, role: channel.Role, method: str, path: str, body: bytes
    ) -> tuple[int, bytes]:
        if role is not channel.Role.CONTROL:
            return 403, b"the policy host answers CONTROL connections only"
        if path != wire.AUTOSCALING_POLICY_PATH:
            return 404, f"no endpoint {path}".encode()
        if method != "POST":
            return 405, b"POST a request"
        return 200, json.dumps(await self.decide(body)).encode()

    async def decide(self, request: bytes) -> dict[str, Any]:
        """The answer to ``request``, in the worker thread, within the deadline; past it the
        process exits (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            timeout = CALL_TIMEOUT_S if self._answered else FIRST_CALL_TIMEOUT_S
            call = loop.run_in_executor(self._worker, answer, self._host, request)
            try:
                result = await asyncio.wait_for(asyncio.shield(call), timeout)
            except TimeoutError:
                log.error("the policy did not answer within %.0f s: exiting", timeout)
                loop.call_later(0.2, os._exit, HUNG_EXIT_CODE)
                return {
                    "error": f"the policy did not answer within {timeout:.0f} s; "
                    "its process was stopped"
                }
            self._answered = True
            return result


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    """(method, path, body) of one HTTP/1.1 request with a ``Content-Length`` body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    request_line, *header_lines = head.split("\r\n")
    method, path, _version = request_line.split(" ", 2)
    length = 0
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if not 0 <= length <= MAX_BODY_BYTES:
        raise ValueError(f"a body of {length} bytes (at most {MAX_BODY_BYTES})")
    body = await reader.readexactly(length) if length else b""
    return method, path, body


def _loader(options: argparse.Namespace) -> Any:
    def load_app() -> Application:
        if options.pickled_file:
            return load_pickled_application(Path(options.pickled_file).read_bytes())
        return load_application(options.import_path, json.loads(options.args))

    return load_app


async def _serve(server: PolicyServer, bind: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server.connection, bind, port)
    log.info("policy host listening on %s:%d", bind, port)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubeserve policy-host")
    parser.add_argument("app", help="the Ray application's name")
    parser.add_argument("--import-path", default="")
    parser.add_argument("--args", default="{}")
    parser.add_argument("--pickled-file", default="")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--identity", required=True, help="the name callers greet (a pod's)")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    secret = channel.take_secret()
    prepare_for_user_code()
    server = PolicyServer(PolicyHost(options.app, _loader(options)), secret, options.identity)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(server, options.host, options.port))
    return 0
