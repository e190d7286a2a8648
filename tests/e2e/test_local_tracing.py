"""``tracing_config`` with ``kubeserve start``: one OpenTelemetry trace per request, across the
proxy, the ingress replica, its handle call and the downstream replica.

Spans are made in three processes (proxy, ingress replica, downstream replica); the test's
exporter (``ks_tracing_exporter``) writes each process's finished spans to a file of its own in a
directory the test reads.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import socket
import time
import urllib.request
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from ks_tracing_exporter import SPANS_DIR_ENV

from support.common import free_port, http, wait_for
from support.grpc_protos import ensure_generated
from support.kubeserve_start import Kubeserve, running_kubeserve

APP = {"name": "traced", "route_prefix": "/traced", "import_path": "ks_tracing_app:app"}
EXPORTER = "ks_tracing_exporter:exporter"
#: a W3C traceparent a client sends: version 00, its trace id and span id, sampled
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def tracing(ratio: float = 1.0, enabled: bool = True) -> dict[str, Any]:
    return {"enabled": enabled, "exporter_import_path": EXPORTER, "sampling_ratio": ratio}


def spans(spans_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(spans_dir.glob("*.jsonl")) if spans_dir.is_dir() else []:
        found += [json.loads(line) for line in path.read_text().splitlines() if line]
    return found


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
    """A GET: its status, JSON answer and request id."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read()), response.headers["x-request-id"]


def pipelined(port: int, paths: list[str]) -> list[int]:
    """GET ``paths`` on one connection, each sent while the one before is served (the proxy
    reads each whole in a read of its own), with the client's traceparent and request ids
    ``pipelined-<i>``; returns the statuses."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for i, path in enumerate(paths):
            head = (
                f"GET {path} HTTP/1.1\r\nHost: x\r\ntraceparent: {TRACEPARENT}\r\n"
                f"x-request-id: pipelined-{i}\r\n\r\n"
            )
            sock.sendall(head.encode())
            time.sleep(0.1)  # not a wait for a result: it makes the next request a read of its own
        reader = sock.makefile("rb")
        statuses = []
        for _ in paths:
            response = HTTPResponse(_Reader(reader))  # type: ignore[arg-type]
            response.begin()
            response.read()
            statuses.append(response.status)
        return statuses


class _Reader:
    """One buffered reader for every response of a connection: ``HTTPResponse`` would make one
    per response (the first swallowing the second) and closes it after a body."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def makefile(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def trace_of(spans_dir: Path, request_id: str, count: int = 6) -> list[dict[str, Any]]:
    """The spans of one request (its id on every one), once all ``count`` were exported."""

    def found() -> list[dict[str, Any]] | None:
        mine = [s for s in spans(spans_dir) if s["attributes"].get("request_id") == request_id]
        return mine if len(mine) >= count else None

    return wait_for(found, 30, what=f"{count} spans of request {request_id}")


def by_name(trace: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    (span,) = [s for s in trace if s["name"].startswith(prefix)]
    return span


def lasted_s(span: dict[str, Any]) -> float:
    return float(span["end"] - span["start"]) / 1e9


@pytest.fixture
def spans_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the exporter of every process kubeserve start runs writes its spans."""
    path = tmp_path / "spans"
    monkeypatch.setenv(SPANS_DIR_ENV, str(path))
    return path


def deploy(ks: Kubeserve, tracing_config: dict[str, Any] | None) -> None:
    options = {} if tracing_config is None else {"tracing_config": tracing_config}
    status, body = ks.put([APP], **options)
    assert status == 200, body
    ks.wait_app("traced")


def test_one_trace_runs_from_the_proxy_through_a_handle_call(
    tmp_path: Path, spans_dir: Path
) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        deploy(ks, tracing())
        status, answer, request_id = get(f"{ks.proxy}/traced")
        assert status == 200, answer
        trace = trace_of(spans_dir, request_id)
        proxy = by_name(trace, "proxy_http_request Ingress GET /traced")
        ingress = by_name(trace, "replica_handle_request Ingress __call__")
        handle = by_name(trace, "route_to_replica Downstream echo")
        downstream = by_name(trace, "replica_handle_request Downstream echo")
        streamed_handle = by_name(trace, "route_to_replica Downstream count")
        streamed = by_name(trace, "replica_handle_request Downstream count")
        assert {s["trace_id"] for s in trace} == {proxy["trace_id"]}, trace
        assert proxy["parent_id"] is None  # no traceparent from the client: a new trace
        assert ingress["parent_id"] == proxy["span_id"]
        assert handle["parent_id"] == ingress["span_id"]
        assert downstream["parent_id"] == handle["span_id"]
        assert streamed_handle["parent_id"] == ingress["span_id"]
        assert streamed["parent_id"] == streamed_handle["span_id"]
        assert len({proxy["pid"], ingress["pid"], downstream["pid"]}) == 3  # three processes
        assert proxy["attributes"]["http.status_code"] == 200
        assert (ingress["attributes"]["app"], ingress["attributes"]["deployment"]) == (
            "traced",
            "Ingress",
        )
        # user code runs inside its replica span: get_current_span() is that span
        assert answer["ingress"]["span_id"] == ingress["span_id"]
        assert answer["downstream"]["span_id"] == downstream["span_id"]
        assert answer["downstream"]["trace_id"] == proxy["trace_id"]
        assert {item["span_id"] for item in answer["streamed"]} == {streamed["span_id"]}

        # a client's W3C traceparent: the proxy's span is its child, in the client's trace
        status, answer, request_id = get(f"{ks.proxy}/traced", {"traceparent": TRACEPARENT})
        assert status == 200, answer
        trace = trace_of(spans_dir, request_id)
        proxy = by_name(trace, "proxy_http_request")
        assert (proxy["trace_id"], proxy["parent_id"]) == (CLIENT_TRACE, CLIENT_SPAN)
        assert {s["trace_id"] for s in trace} == {CLIENT_TRACE}
        assert by_name(trace, "replica_handle_request Ingress")["parent_id"] == proxy["span_id"]

        # a request read whole while another was served (pipelined): its traceparent too
        first, second = pipelined(ks.proxy_port, ["/traced?sleep=0.5", "/traced"])
        assert first == second == 200
        trace = trace_of(spans_dir, "pipelined-1")
        proxy = by_name(trace, "proxy_http_request")
        assert (proxy["trace_id"], proxy["parent_id"]) == (CLIENT_TRACE, CLIENT_SPAN)
        assert by_name(trace, "replica_handle_request Ingress")["parent_id"] == proxy["span_id"]

        # tracing_config is fixed while the serving layer runs, like logging_config
        status, body = ks.put([APP], tracing_config=tracing(0.5))
        assert status == 409 and "tracing_config" in str(body), body
        ks.shutdown()


def test_sampling_ratio_zero_makes_no_spans_but_a_sampled_traceparent_is_followed(
    tmp_path: Path, spans_dir: Path
) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        deploy(ks, tracing(ratio=0.0))
        for _ in range(5):
            status, answer, _ = get(f"{ks.proxy}/traced")
            assert status == 200, answer
            assert answer["ingress"]["otel_loaded"]  # tracing is on, the spans not sampled
            # unsampled, yet one trace: the downstream call followed the proxy's decision
            assert answer["downstream"]["trace_id"] == answer["ingress"]["trace_id"]
        # parent-based, as Ray samples: the client decided to sample this one
        status, _, request_id = get(f"{ks.proxy}/traced", {"traceparent": TRACEPARENT})
        assert status == 200
        trace = trace_of(spans_dir, request_id)
        assert {s["trace_id"] for s in trace} == {CLIENT_TRACE}
        # nothing else was exported: the unsampled requests made no spans
        assert len(spans(spans_dir)) == 6
        ks.shutdown()


def test_disabled_tracing_makes_no_spans_and_never_loads_opentelemetry(
    tmp_path: Path, spans_dir: Path
) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        deploy(ks, tracing(enabled=False))
        status, answer, _ = get(f"{ks.proxy}/traced", {"traceparent": TRACEPARENT})
        assert status == 200, answer
        assert answer == {
            "ingress": {"otel_loaded": False},
            "downstream": {"x": 1, "otel_loaded": False},
            "streamed": [{"i": 0, "otel_loaded": False}, {"i": 1, "otel_loaded": False}],
        }
        assert spans(spans_dir) == []
        assert not spans_dir.exists()  # the exporter was never even called
        ks.shutdown()


def test_a_tracing_config_the_data_plane_cannot_apply_is_a_400_at_its_field(
    tmp_path: Path,
) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        cases = [
            (
                {"enabled": True, "exporter_import_path": "no_such_module:exporter"},
                ["tracing_config", "exporter_import_path"],
                "does not import",
            ),
            ({"enabled": True, "sampling_ratio": 1.5}, ["tracing_config", "sampling_ratio"], ""),
            (
                {"enabled": True, "exporter_import_path": "not a path"},
                ["tracing_config", "exporter_import_path"],
                "import path",
            ),
        ]
        for config, loc, words in cases:
            status, body = ks.put([APP], tracing_config=config)
            assert status == 400, body
            detail = json.dumps(body)
            assert json.dumps(loc)[1:-1] in detail, body
            assert words in detail, body
        assert http("GET", f"{ks.api}/api/serve/applications/")[1]["applications"] == {}
        # its module exists, its function does not: only importing it tells, which the build
        # does where the application runs: the application fails to deploy, saying why
        config = {"enabled": True, "exporter_import_path": "ks_tracing_exporter:nowhere"}
        status, body = ks.put([APP], tracing_config=config)
        assert status == 200, body
        message = ks.wait_app("traced", status="DEPLOY_FAILED")["message"]
        assert "tracing_config.exporter_import_path" in message, message
        assert "ks_tracing_exporter:nowhere" in message, message


def test_without_an_exporter_spans_are_json_lines_next_to_the_logs(tmp_path: Path) -> None:
    """Ray's default exporter: a file per process in the logs' ``spans/`` directory."""
    with running_kubeserve(tmp_path / "state") as ks:
        deploy(ks, {"enabled": True, "sampling_ratio": 1.0})
        status, _, request_id = get(f"{ks.proxy}/traced")
        assert status == 200
        spans_dir = tmp_path / "state" / "logs" / "spans"

        def written() -> dict[str, list[str]] | None:
            found = {
                path.name: [
                    json.loads(line)["name"]
                    for line in path.read_text().splitlines()
                    if request_id in line
                ]
                for path in spans_dir.glob("*_tracing.json")
            }
            return found if sum(len(names) for names in found.values()) >= 6 else None

        found = wait_for(written, 30, what="the spans in logs/spans/")
        assert found["proxy_tracing.json"] == ["proxy_http_request Ingress GET /traced"]
        assert sorted(found) == sorted(
            ["proxy_tracing.json"] + [name for name in found if name.startswith("replica_traced_")]
        )
        assert len(found) == 3  # the proxy and two replicas
        ks.shutdown()


def test_a_streamed_answer_and_a_websocket_are_traced_until_they_end(
    tmp_path: Path, spans_dir: Path
) -> None:
    """A streamed response's replica span ends with the stream (its code runs in the span until
    then), so does a streamed handle call's; a WebSocket is a proxy span and a replica span
    (Ray's ``proxy_websocket_request``) as long as the socket is open."""
    websocket_app = {
        "name": "ws",
        "route_prefix": "/ws",
        "import_path": "ray_websocket_app:echo_app",
    }
    with running_kubeserve(tmp_path / "state") as ks:
        status, body = ks.put([APP, websocket_app], tracing_config=tracing())
        assert status == 200, body
        ks.wait_app("traced")
        ks.wait_app("ws")

        pause = 0.4
        request = urllib.request.Request(
            f"{ks.proxy}/traced/stream?pause={pause}", headers={"x-request-id": "stream-1"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            lines = [json.loads(line) for line in response.read().splitlines()]
        assert [line["downstream"]["i"] for line in lines] == [0, 1, 2]
        trace = trace_of(spans_dir, "stream-1", 4)
        ingress = by_name(trace, "replica_handle_request Ingress __call__")
        streamed = by_name(trace, "replica_handle_request Downstream count")
        assert ingress["parent_id"] == by_name(trace, "proxy_http_request")["span_id"]
        assert streamed["parent_id"] == by_name(trace, "route_to_replica Downstream")["span_id"]
        # the ingress's code ran in its span for the whole stream, which ended after it
        assert {line["ingress"]["span_id"] for line in lines} == {ingress["span_id"]}
        assert {line["downstream"]["span_id"] for line in lines} == {streamed["span_id"]}
        assert lasted_s(ingress) >= 2 * pause, ingress
        assert lasted_s(streamed) >= 2 * pause, streamed

        async def websocket() -> None:
            headers = {"traceparent": TRACEPARENT, "x-request-id": "ws-1"}
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(f"{ks.proxy}/ws/", headers=headers) as ws,
            ):
                await ws.send_str("hello")
                assert await ws.receive_str(timeout=30) == "hello"
                await asyncio.sleep(pause)  # the socket stays open: its spans go on

        asyncio.run(websocket())
        trace = trace_of(spans_dir, "ws-1", 2)
        proxy = by_name(trace, "proxy_websocket_request EchoServer WS /ws")
        replica = by_name(trace, "replica_handle_request EchoServer __call__")
        assert (proxy["trace_id"], proxy["parent_id"]) == (CLIENT_TRACE, CLIENT_SPAN)
        assert replica["parent_id"] == proxy["span_id"]
        assert proxy["attributes"]["request_type"] == "websocket"
        assert proxy["attributes"]["http.status_code"] == 101
        assert lasted_s(proxy) >= pause and lasted_s(replica) >= pause
        ks.shutdown()


GRPC_APPS = [
    {"name": "app1", "route_prefix": "/app1", "import_path": "ray_grpc_app:g"},
    {"name": "ctx", "route_prefix": "/ctx", "import_path": "ray_grpc_context_app:g"},
    {"name": "checks", "route_prefix": "/checks", "import_path": "ks_grpc_checks_app:app"},
]
SERVICE = "/userdefinedprotos.UserDefinedService"


def test_grpc_calls_are_traced_as_rays_grpc_proxy_traces_them(
    tmp_path: Path, spans_dir: Path
) -> None:
    """Ray's ``proxy_grpc_request`` span per call (a client's ``traceparent`` metadata its
    parent), ended with the call's status code; its context goes on to the replica."""
    ensure_generated()
    pb2 = importlib.import_module("user_defined_protos_pb2")
    stubs = importlib.import_module("user_defined_protos_pb2_grpc")
    grpc_port = free_port()
    options = {
        "port": grpc_port,
        "grpc_servicer_functions": [
            "user_defined_protos_pb2_grpc.add_UserDefinedServiceServicer_to_server",
            "ks_grpc_checks_pb2_grpc.add_ChecksServicer_to_server",
        ],
    }
    with running_kubeserve(tmp_path / "state") as ks:
        status, body = ks.put(GRPC_APPS, tracing_config=tracing(), grpc_options=options)
        assert status == 200, body
        ks.wait_app("app1", timeout_s=120)
        ks.wait_app("ctx", timeout_s=120)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = stubs.UserDefinedServiceStub(channel)
            message = pb2.UserDefinedMessage(name="foo", num=30, origin="bar")

            metadata = (("application", "app1"), ("request_id", "grpc-1"))
            _, call = stub.__call__.with_call(
                message, metadata=(*metadata, ("traceparent", TRACEPARENT))
            )
            assert call.code() == grpc.StatusCode.OK
            trace = trace_of(spans_dir, "grpc-1", 3)
            proxy = by_name(trace, f"proxy_grpc_request GrpcDeployment {SERVICE}/__call__")
            route = by_name(trace, "route_to_replica GrpcDeployment __call__")
            replica = by_name(trace, "replica_handle_request GrpcDeployment __call__")
            assert (proxy["trace_id"], proxy["parent_id"]) == (CLIENT_TRACE, CLIENT_SPAN)
            assert route["parent_id"] == proxy["span_id"]
            assert replica["parent_id"] == route["span_id"]
            assert {s["trace_id"] for s in trace} == {CLIENT_TRACE}
            expected = {
                "request_id": "grpc-1",
                "app": "app1",
                "deployment": "GrpcDeployment",
                "request_type": "grpc",
                "rpc.system": "grpc",
                "rpc.method": f"{SERVICE}/__call__",
                "rpc.grpc.status_code": "OK",
            }
            assert {key: proxy["attributes"].get(key) for key in expected} == expected
            assert proxy["status"] != "ERROR"

            # a server stream (ten items 10 ms apart): the proxy's span lasts as long
            items = list(
                stub.Streaming(
                    message, metadata=(("application", "app1"), ("request_id", "grpc-2"))
                )
            )
            assert len(items) == 10
            trace = trace_of(spans_dir, "grpc-2", 3)
            proxy = by_name(trace, f"proxy_grpc_request GrpcDeployment {SERVICE}/Streaming")
            replica = by_name(trace, "replica_handle_request GrpcDeployment Streaming")
            assert proxy["parent_id"] is None  # no traceparent: a trace of its own
            assert lasted_s(proxy) >= 0.09 and lasted_s(replica) >= 0.09

            # a status the method set: the span ends with it, an error
            with pytest.raises(grpc.RpcError) as raised:
                stub.__call__(
                    pb2.UserDefinedMessage(name="new", num=1, origin="x"),
                    metadata=(("application", "ctx"), ("request_id", "grpc-3")),
                )
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            proxy = by_name(trace_of(spans_dir, "grpc-3", 3), "proxy_grpc_request")
            assert proxy["attributes"]["rpc.grpc.status_code"] == "INVALID_ARGUMENT"

            # the client's stream reaches the method while the call is traced
            checks_pb2 = importlib.import_module("ks_grpc_checks_pb2")
            checks = importlib.import_module("ks_grpc_checks_pb2_grpc").ChecksStub(channel)
            asks = [checks_pb2.Ask(text=t, count=i) for i, t in enumerate("abc")]
            routed = (("application", "checks"),)
            answer = checks.Upload(iter(asks), metadata=(*routed, ("request_id", "grpc-4")))
            assert (answer.text, answer.index) == ("a+b+c", 3)
            traced = trace_of(spans_dir, "grpc-4", 2)  # its handle call is a span
            by_name(traced, "route_to_replica Checks Upload")
            chat = checks.Chat(iter(asks), metadata=(*routed, ("request_id", "grpc-5")))
            assert [(a.text, a.index) for a in chat] == [("re:a", 0), ("re:b", 1), ("re:c", 2)]
            assert proxy["status"] == "ERROR"
        ks.shutdown()
