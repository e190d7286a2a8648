"""The gRPC proxy end to end: a real ``kubeserve start`` with ``grpc_options``, the applications of
Ray Serve 2.60's gRPC guide (and a service of our own for the corners), called with a real grpcio
client and stubs generated from the protos by grpcio-tools."""

from __future__ import annotations

import importlib
import os
import queue
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.message_factory import GetMessageClass
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from support.common import free_port, http, wait_for
from support.grpc_protos import ensure_generated
from support.kubeserve_start import Kubeserve, running_kubeserve
from support.metrics_scrape import scrape, value

SERVICERS = [
    "user_defined_protos_pb2_grpc.add_UserDefinedServiceServicer_to_server",
    "user_defined_protos_pb2_grpc.add_ImageClassificationServiceServicer_to_server",
    "ks_grpc_checks_pb2_grpc.add_ChecksServicer_to_server",
]
APPS = [
    {"name": "app1", "route_prefix": "/app1", "import_path": "ray_grpc_app:g"},
    {"name": "ctx", "route_prefix": "/ctx", "import_path": "ray_grpc_context_app:g"},
    {"name": "checks", "route_prefix": "/checks", "import_path": "ks_grpc_checks_app:app"},
    {"name": "other", "route_prefix": "/other", "import_path": "ks_grpc_checks_app:other"},
]


def module(name: str) -> Any:
    return importlib.import_module(name)


@pytest.fixture(scope="module", params=["python", "native"])
def instance(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Kubeserve, int]]:
    """The instance every test calls: the Python proxy's grpc.aio server on the gRPC port, or
    (``native``) the native gRPC front with that server behind it, the same answers expected."""
    ensure_generated()
    grpc_port = free_port()
    args = ("--data-path", request.param)
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve-grpc"), args=args) as ks:
        options = {
            "port": grpc_port,
            "grpc_servicer_functions": SERVICERS,
            "request_timeout_s": 2,
        }
        status, body = ks.put(APPS, grpc_options=options)
        assert status == 200, body
        for app in APPS:
            ks.wait_app(str(app["name"]), timeout_s=120)
        yield ks, grpc_port


@pytest.fixture()
def channel(instance: tuple[Kubeserve, int]) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{instance[1]}") as chan:
        grpc.channel_ready_future(chan).result(timeout=30)
        yield chan


def test_the_guide_unary_call_with_metadata(channel: grpc.Channel) -> None:
    pb2, stubs = module("user_defined_protos_pb2"), module("user_defined_protos_pb2_grpc")
    stub = stubs.UserDefinedServiceStub(channel)
    request = pb2.UserDefinedMessage(name="foo", num=30, origin="bar")
    response, call = stub.__call__.with_call(request=request, metadata=(("application", "app1"),))
    assert call.code() == grpc.StatusCode.OK
    assert (response.greeting, response.num) == ("Hello foo from bar", 60)
    assert any(key == "request_id" for key, _ in call.trailing_metadata())


def test_request_id_and_multiplexed_model_id_metadata(channel: grpc.Channel) -> None:
    pb2, stubs = module("user_defined_protos_pb2"), module("user_defined_protos_pb2_grpc")
    stub = stubs.UserDefinedServiceStub(channel)
    metadata = (("application", "app1"), ("request_id", "123"), ("multiplexed_model_id", "999"))
    response, call = stub.Multiplexing.with_call(
        request=pb2.UserDefinedMessage2(), metadata=metadata
    )
    assert response.greeting == "Method2 called model, loading model: 999"
    assert ("request_id", "123") in list(call.trailing_metadata())


def test_server_streaming(channel: grpc.Channel) -> None:
    pb2, stubs = module("user_defined_protos_pb2"), module("user_defined_protos_pb2_grpc")
    stub = stubs.UserDefinedServiceStub(channel)
    request = pb2.UserDefinedMessage(name="foo", num=30, origin="bar")
    responses = list(stub.Streaming(request=request, metadata=(("application", "app1"),)))
    assert [r.num for r in responses] == [60 + i for i in range(10)]
    assert responses[3].greeting == "3: Hello foo from bar"


def test_grpc_context_sets_code_details_and_trailers(channel: grpc.Channel) -> None:
    pb2, stubs = module("user_defined_protos_pb2"), module("user_defined_protos_pb2_grpc")
    stub = stubs.UserDefinedServiceStub(channel)
    request = pb2.UserDefinedMessage(name="ctx-name", num=30, origin="bar")
    metadata = (("application", "ctx"),)
    with pytest.raises(grpc.RpcError) as raised:
        stub.__call__.with_call(request=request, metadata=metadata)
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "ctx-name not found, adding to nums."
    trailers = list(error.trailing_metadata())
    assert ("num", "0") in trailers
    assert any(key == "request_id" for key, _ in trailers)
    response, call = stub.__call__.with_call(request=request, metadata=metadata)
    # The guide also expects details "ctx-name found." here, but grpcio's aio server (Ray's
    # proxy's too) sends no details with an OK status.
    assert call.code() == grpc.StatusCode.OK
    assert ("num", "0") in list(call.trailing_metadata())
    assert response.num == 0


def test_the_builtin_serve_api_service(channel: grpc.Channel) -> None:
    pb2, stubs = module("ray_serve_api_pb2"), module("ray_serve_api_pb2_grpc")
    stub = stubs.RayServeAPIServiceStub(channel)
    listed = stub.ListApplications(pb2.ListApplicationsRequest())
    assert sorted(listed.application_names) == sorted(str(a["name"]) for a in APPS)
    assert stub.Healthz(pb2.HealthzRequest()).message == "success"


def checks(channel: grpc.Channel) -> Any:
    return module("ks_grpc_checks_pb2_grpc").ChecksStub(channel)


def ask(text: str = "", count: int = 0) -> Any:
    return module("ks_grpc_checks_pb2").Ask(text=text, count=count)


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> Any:
    with pytest.raises(grpc.RpcError) as raised:
        result = call(*args, **kwargs)
        if not hasattr(result, "SerializeToString"):  # a stream: the error comes as it is read
            list(result)
    return raised.value


def test_routing_by_application_metadata(channel: grpc.Channel) -> None:
    stub = checks(channel)
    answer = stub.Echo(ask("hi"), metadata=(("application", "checks"), ("request_id", "r-1")))
    assert answer.text == "hi|app=checks|rid=r-1"
    assert stub.Echo(ask("hi"), metadata=(("application", "other"),)).text == "other:hi"
    missing = rpc_error(stub.Echo, ask("hi"), metadata=(("application", "nope"),))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert missing.details() == (
        "Application 'nope' not found. Ping /ray.serve.RayServeAPIService/ListApplications "
        "for available applications."
    )
    unset = rpc_error(stub.Echo, ask("hi"))
    assert unset.code() == grpc.StatusCode.NOT_FOUND
    assert unset.details().startswith("Application metadata not set.")


def test_errors_are_status_codes(channel: grpc.Channel) -> None:
    stub = checks(channel)
    metadata = (("application", "checks"),)
    raised = rpc_error(stub.Raise, ask("x"), metadata=metadata)
    assert raised.code() == grpc.StatusCode.INTERNAL
    assert "ValueError: no good: x" in raised.details()
    coded = rpc_error(stub.RaiseWithCode, ask("you"), metadata=metadata)
    assert (coded.code(), coded.details()) == (grpc.StatusCode.PERMISSION_DENIED, "not for you")
    status = rpc_error(stub.SetStatus, ask("because"), metadata=metadata)
    assert (status.code(), status.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "precondition",
    )
    assert ("why", "because") in list(status.trailing_metadata())
    slow = rpc_error(stub.Slow, ask("10"), metadata=metadata)
    assert (slow.code(), slow.details()) == (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "Request timed out after 2.0s.",
    )
    absent = rpc_error(stub.Missing, ask(), metadata=metadata)
    assert absent.code() == grpc.StatusCode.UNAVAILABLE
    assert "has no method 'Missing'" in absent.details()


def test_a_client_cancelling_a_unary_call_cancels_the_method(
    instance: tuple[Kubeserve, int], channel: grpc.Channel
) -> None:
    """A client's cancel (RST_STREAM) while the replica runs a unary method cancels the
    method's task there, long before ``request_timeout_s`` (2 s here) would, on both paths; the
    call is counted CANCELLED, and the replica serves the next calls."""
    ks, _ = instance
    stub = checks(channel)
    metadata = (("application", "checks"),)
    tag = f"cancel-{time.time_ns()}"
    pending = stub.Hold.future(ask(tag, 60), metadata=metadata)
    wait_for(
        lambda: stub.Held(ask(tag), metadata=metadata).text == "running",
        10,
        what="the replica running the Hold call",
    )
    assert pending.cancel()
    held = wait_for(
        lambda: (text := stub.Held(ask(tag), metadata=metadata).text) != "running" and text,
        10,
        what="the replica cancelling the Hold call",
    )
    assert held.startswith("cancelled after ")
    assert float(held.split()[-1]) < 1.5  # the client's cancel, not the request timeout
    hold = {"method": "/ksgrpc.Checks/Hold", "application": "checks", "route": "checks"}
    wait_for(
        lambda: (
            value(scrape(ks), "ray_serve_num_grpc_requests_total", status_code="CANCELLED", **hold)
            >= 1
        ),
        10,
        what="the cancelled call in /metrics",
    )
    assert stub.Echo(ask("after"), metadata=metadata, timeout=10).text.startswith("after|")


def test_access_lines_of_grpc_calls(instance: tuple[Kubeserve, int], channel: grpc.Channel) -> None:
    """Each call answered (natively too: formatted there, written by the proxy) has Ray's
    access line in the proxy's log, with its request id, given or made."""
    ks, _ = instance
    stub = checks(channel)
    rid = f"access-{time.time_ns()}"
    metadata = (("application", "checks"), ("request_id", rid))
    stub.Echo(ask("a"), metadata=metadata, timeout=10)
    _, call = stub.Echo.with_call(ask("b"), metadata=(("application", "checks"),), timeout=10)
    made = dict(call.trailing_metadata())["request_id"]
    (proxy,) = ks.details()["proxies"].values()
    log = Path(proxy["log_file_path"])
    wait_for(
        lambda: all(
            f" {r} -- /ksgrpc.Checks/Echo checks OK " in log.read_text() for r in (rid, made)
        ),
        10,
        what="the proxy's access lines of both calls",
    )


def test_streams_and_their_errors(channel: grpc.Channel) -> None:
    stub = checks(channel)
    metadata = (("application", "checks"),)
    assert [a.index for a in stub.Count(ask("n", 5), metadata=metadata)] == list(range(5))
    got: list[int] = []
    with pytest.raises(grpc.RpcError) as raised:
        for answer in stub.CountThenRaise(ask("n", 3), metadata=metadata):
            got.append(answer.index)
    error: Any = raised.value
    assert got == [0, 1, 2]
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "stream broke" in error.details()


def test_a_stream_whose_method_sets_its_status_and_trailers(channel: grpc.Channel) -> None:
    """Items yielded after the method changed its context still arrive; the stream ends with
    the code, details and trailing metadata it set last (natively served: relayed per item)."""
    stub = checks(channel)
    metadata = (("application", "checks"), ("request_id", "status-1"))
    got: list[int] = []
    call = stub.CountWithStatus(ask("s", 4), metadata=metadata)
    with pytest.raises(grpc.RpcError):
        for answer in call:
            got.append(answer.index)
    assert got == [0, 1, 2, 3]
    assert call.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert call.details() == "stopped at 3 ✓"
    trailers = list(call.trailing_metadata())
    assert ("seen", "1") in trailers
    assert ("request_id", "status-1") in trailers


def test_a_stream_past_request_timeout_ends_deadline_exceeded(channel: grpc.Channel) -> None:
    """``grpc_options.request_timeout_s`` (2 s here) bounds a stream as a whole, on both paths,
    even one that keeps yielding. The stream is paced so that this client keeps up: the status
    comes after every item already sent, and a client slower than the stream first reads what
    its flow-control window let through (100k items, seconds of this loop on a busy machine)."""
    stub = checks(channel)
    call = stub.Ticks(ask("paced", 10**9), metadata=(("application", "checks"),))
    started = time.monotonic()
    got = 0
    with pytest.raises(grpc.RpcError):
        for _ in call:
            got += 1
    assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert call.details() == "Request timed out after 2.0s."
    assert 1.5 < time.monotonic() - started < 10
    assert got > 0


def test_client_streaming_method_reads_the_clients_messages(channel: grpc.Channel) -> None:
    stub = checks(channel)
    asks = iter([ask("a"), ask("b"), ask("c")])
    answer, call = stub.Upload.with_call(asks, metadata=(("application", "checks"),))
    assert (answer.text, answer.index) == ("a+b+c", 3)
    trailers = list(call.trailing_metadata())
    assert ("exhausted", "True") in trailers
    assert any(key == "request_id" for key, _ in trailers)
    empty = stub.Upload(iter([]), metadata=(("application", "checks"),))
    assert (empty.text, empty.index) == ("", 0)


def test_bidirectional_method_answers_while_the_client_still_sends(
    channel: grpc.Channel,
) -> None:
    """Each message is sent only after the answer to the one before came back: a proxy that
    waited for the client's whole stream would hang here (the call's deadline fails it)."""
    answered: queue.Queue[int] = queue.Queue()

    def asks() -> Iterator[Any]:
        for i in range(4):
            yield ask(f"m{i}", i)
            assert answered.get(timeout=10) == i

    got = []
    for answer in checks(channel).Chat(asks(), metadata=(("application", "checks"),), timeout=30):
        got.append((answer.text, answer.index))
        answered.put(answer.index)
    assert got == [(f"re:m{i}", i) for i in range(4)]


def test_client_stream_errors_are_status_codes(channel: grpc.Channel) -> None:
    stub = checks(channel)
    metadata = (("application", "checks"),)
    stopped = rpc_error(
        stub.UploadThenRaise,
        iter([ask("go", 1), ask("stop", 2), ask("never", 3)]),
        metadata=metadata,
    )
    assert (stopped.code(), stopped.details()) == (grpc.StatusCode.ABORTED, "stopped after 2")
    unserved = rpc_error(stub.Unserved, iter([ask("a")]), metadata=metadata)
    assert unserved.code() == grpc.StatusCode.INTERNAL
    assert "did not return a generator" in unserved.details()
    missing = rpc_error(stub.Upload, iter([ask("a")]), metadata=(("application", "nope"),))
    assert missing.code() == grpc.StatusCode.NOT_FOUND


def test_server_reflection_describes_the_users_services(channel: grpc.Channel) -> None:
    """What grpcurl does with a server that answers reflection: list its services, fetch their
    descriptors, and call a method with messages built from them alone."""
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {
        "ksgrpc.Checks",
        "userdefinedprotos.UserDefinedService",
        "userdefinedprotos.ImageClassificationService",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services
    assert "ray.serve.RayServeAPIService" not in services  # as Ray: the built-in one is not listed
    pool = descriptor_pool.DescriptorPool(database)
    service = pool.FindServiceByName("ksgrpc.Checks")
    chat = service.methods_by_name["Chat"]
    assert (chat.client_streaming, chat.server_streaming) == (True, True)
    echo = service.methods_by_name["Echo"]
    request_class = GetMessageClass(echo.input_type)
    answer_class = GetMessageClass(echo.output_type)
    call = channel.unary_unary(
        f"/{service.full_name}/{echo.name}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=answer_class.FromString,
    )
    answer = call(request_class(text="reflected"), metadata=(("application", "other"),))
    assert answer.text == "other:reflected"


def test_grpc_metrics_with_rays_names(
    instance: tuple[Kubeserve, int], channel: grpc.Channel
) -> None:
    """Counts go up by at least the calls made here: other tests' calls may still be in the
    proxy's batch when ``before`` is read."""
    ks, _ = instance
    stub = checks(channel)
    before = scrape(ks)
    echo = {"method": "/ksgrpc.Checks/Echo", "application": "other", "route": "other"}
    failed = {"method": "/ksgrpc.Checks/Raise", "application": "checks", "route": "checks"}
    base_ok = value(before, "ray_serve_num_grpc_requests_total", status_code="OK", **echo)
    base_err = value(before, "ray_serve_num_grpc_error_requests_total", **failed)
    for _ in range(3):
        stub.Echo(ask("m"), metadata=(("application", "other"),))
    rpc_error(stub.Raise, ask("x"), metadata=(("application", "checks"),))
    rpc_error(stub.Echo, ask("x"), metadata=(("application", "nope"),))
    samples = wait_for(
        lambda: (
            (s := scrape(ks))
            and value(s, "ray_serve_num_grpc_requests_total", status_code="OK", **echo)
            >= base_ok + 3
            and value(s, "ray_serve_num_grpc_error_requests_total", **failed) >= base_err + 1
            and value(s, "ray_serve_grpc_request_latency_ms_count", status_code="OK", **echo) >= 3
            and s
        ),
        10,
        what="the gRPC proxy's counts in /metrics",
    )
    assert (
        value(samples, "ray_serve_num_grpc_error_requests_total", error_code="INTERNAL", **failed)
        >= base_err + 1
    )
    assert (
        value(
            samples,
            "ray_serve_num_deployment_grpc_error_requests_total",
            deployment="Checks",
            error_code="INTERNAL",
            **failed,
        )
        >= 1
    )
    assert (
        value(
            samples,
            "ray_serve_num_grpc_requests_total",
            status_code="NOT_FOUND",
            route="",
            application="",
        )
        >= 1
    )
    assert value(samples, "ray_serve_grpc_request_latency_ms_count", status_code="OK", **echo) >= 3
    healthz = "/ray.serve.RayServeAPIService/Healthz"
    stubs = module("ray_serve_api_pb2_grpc").RayServeAPIServiceStub(channel)
    stubs.Healthz(module("ray_serve_api_pb2").HealthzRequest())
    wait_for(
        lambda: value(
            scrape(ks),
            "ray_serve_num_grpc_requests_total",
            method=healthz,
            route=healthz,
            application="",
            status_code="OK",
        ),
        10,
        what="the built-in service's call in /metrics",
    )
    assert value(samples, "ray_serve_num_grpc_error_requests_total", **echo) == 0
    assert "ray_serve_num_ongoing_grpc_requests" in samples


def test_http_still_served_and_grpc_options_fixed(instance: tuple[Kubeserve, int]) -> None:
    ks, grpc_port = instance
    status, _ = http("GET", f"{ks.proxy}/-/routes")
    assert status == 200
    changed = {"port": grpc_port, "grpc_servicer_functions": SERVICERS[:1]}
    status, body = ks.put(APPS, grpc_options=changed)
    assert status == 409, body
    assert "grpc_options.grpc_servicer_functions" in str(body)


def test_single_application_needs_no_metadata(tmp_path_factory: pytest.TempPathFactory) -> None:
    ensure_generated()
    grpc_port = free_port()
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve-grpc-one")) as ks:
        options = {
            "port": grpc_port,
            "grpc_servicer_functions": SERVICERS,
            "enable_reflection": False,
        }
        status, body = ks.put(APPS[:1], grpc_options=options)
        assert status == 200, body
        ks.wait_app("app1", timeout_s=120)
        pb2, stubs = module("user_defined_protos_pb2"), module("user_defined_protos_pb2_grpc")
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as chan:
            stub = stubs.UserDefinedServiceStub(chan)
            request = pb2.UserDefinedMessage(name="a", num=1, origin="b")
            response = wait_for(lambda: _answer(stub, request), 30, what="a gRPC answer")
            assert response.greeting == "Hello a from b"
            with pytest.raises(grpc.RpcError) as raised:  # enable_reflection: false
                ProtoReflectionDescriptorDatabase(chan).get_services()
            error: Any = raised.value
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_client_stream_read_slowly_slows_its_client(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The replica stops reading a client stream its method does not keep up with, the proxy
    stops taking messages from the client, and HTTP/2 flow control holds the client: nothing
    on the way buffers the whole stream."""
    ensure_generated()
    grpc_port = free_port()
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve-grpc-slow")) as ks:
        options = {"port": grpc_port, "grpc_servicer_functions": SERVICERS}
        status, body = ks.put(APPS[2:3], grpc_options=options)
        assert status == 200, body
        ks.wait_app("checks", timeout_s=120)
        (proxy,) = (int(p["worker_id"]) for p in ks.details()["proxies"].values())
        (replica,) = ks.running_replicas("checks", "Checks")
        # the proxy's native front (kubeserve-fastpath, on the default data path) counts too
        children = Path(f"/proc/{proxy}/task/{proxy}/children").read_text().split()
        processes = (proxy, replica, *map(int, children))
        sent = 0
        total, size, hold_s = 4000, 32 * 1024, 5

        def asks() -> Iterator[Any]:
            nonlocal sent
            yield ask("hold", hold_s)
            for _ in range(total):
                sent += 1
                yield ask("x" * size)

        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as chan:
            rss = {pid: rss_mib(pid) for pid in processes}
            call = checks(chan).Upload.future(asks(), metadata=(("application", "checks"),))
            time.sleep(hold_s - 1)  # the method still sleeps on its first message
            sent_while_held = sent
            grown = {pid: rss_mib(pid) - before for pid, before in rss.items()}
            answer = call.result(timeout=120)
        assert answer.index == total  # nothing lost once the method reads again
        # 4,000 messages of 32 KB (125 MB) offered. In flight while the method sleeps: the
        # replica's queue (64 messages, 2 MB), HTTP/2's windows, and the sockets' buffers of
        # both hops, which the kernel grows (up to 32 MB a socket here): how many messages the
        # client got rid of depends on that, so the bound is on the processes' memory.
        print(f"while held: {sent_while_held} sent, MiB grown by pid {grown}")
        assert sent_while_held < total, sent_while_held
        assert all(mib < 32 for mib in grown.values()), (grown, sent_while_held)


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid``, MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line[:6] == "VmRSS:") / 1024


def _answer(stub: Any, request: Any) -> Any:
    try:
        return stub.__call__(request, timeout=5)
    except grpc.RpcError:
        return None


def test_the_native_front_answers_unary_calls_without_the_python_proxy(
    request: pytest.FixtureRequest, instance: tuple[Kubeserve, int], channel: grpc.Channel
) -> None:
    """With the native data path, a unary call is the native process's own: it is answered
    while the Python proxy (and its grpc.aio server) is stopped; what the native process hands
    over (reflection, the built-in service) waits for the proxy and is answered after."""
    if request.node.callspec.params["instance"] != "native":
        pytest.skip("the native gRPC front only")
    ks, _ = instance
    (proxy,) = ks.details()["proxies"].values()
    pid = int(proxy["worker_id"])
    stub = checks(channel)
    pb2, stubs = module("ray_serve_api_pb2"), module("ray_serve_api_pb2_grpc")
    os.kill(pid, signal.SIGSTOP)
    try:
        metadata = (("application", "checks"), ("request_id", "frozen-1"))
        answer, call = stub.Echo.with_call(ask("hi"), metadata=metadata, timeout=20)
        assert answer.text == "hi|app=checks|rid=frozen-1"
        assert ("request_id", "frozen-1") in list(call.trailing_metadata())
        pending = stubs.RayServeAPIServiceStub(channel).Healthz.future(
            pb2.HealthzRequest(), timeout=30
        )
        time.sleep(0.5)
        assert not pending.done()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert pending.result().message == "success"


def test_the_private_relay_method_is_not_reachable(channel: grpc.Channel) -> None:
    """The native front's relay (a replica answer unpickled by the proxy) is never a client's:
    from outside it is an unknown method, on either path."""
    relay = channel.unary_unary("/kubeserve.internal.NativeRelay/Answer")
    metadata = (("x-kubeserve-relay", "a b c#d e 200 0"), ("x-kubeserve-signature", "00"))
    raised = rpc_error(relay, b"C", metadata=metadata)
    assert raised.code() == grpc.StatusCode.UNIMPLEMENTED


def _native_args(grpc_port: int) -> list[str]:
    """The command line of the native process serving ``grpc_port``."""
    return _native_process(grpc_port)[1]


def _native_process(grpc_port: int) -> tuple[int, list[str]]:
    """The pid and command line of the native process serving ``grpc_port``."""
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError):
            continue
        if (
            args
            and args[0].endswith("kubeserve-fastpath")
            and "--grpc-listen" in args
            and args[args.index("--grpc-listen") + 1].endswith(f":{grpc_port}")
        ):
            return int(entry.name), args
    raise AssertionError(f"no kubeserve-fastpath process serves gRPC on {grpc_port}")


def test_the_python_grpc_server_behind_the_native_front_is_a_private_unix_socket(
    request: pytest.FixtureRequest, instance: tuple[Kubeserve, int], channel: grpc.Channel
) -> None:
    """Behind the native front, the Python grpc.aio server listens on a unix socket in a
    directory only the proxy's user may enter (as the HTTP hand-off's), no TCP port: no other
    local process reaches it and skips the native front."""
    if request.node.callspec.params["instance"] != "native":
        pytest.skip("the native gRPC front only")
    args = _native_args(instance[1])
    fallback = args[args.index("--grpc-fallback") + 1]
    assert fallback.startswith("unix:"), fallback
    path = Path(fallback[len("unix:") :])
    assert path.is_socket()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    http_fallback = args[args.index("--fallback") + 1]
    assert Path(http_fallback[len("unix:") :]).parent == path.parent
    # and what it serves is reached through it: a call the native front hands over
    pb2, stubs = module("ray_serve_api_pb2"), module("ray_serve_api_pb2_grpc")
    answer = stubs.RayServeAPIServiceStub(channel).Healthz(pb2.HealthzRequest(), timeout=30)
    assert answer.message == "success"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_the_native_front_serves_server_streams_itself_with_backpressure(
    request: pytest.FixtureRequest, instance: tuple[Kubeserve, int], channel: grpc.Channel
) -> None:
    """A server-streaming call is the native process's own: answered while the Python proxy is
    stopped. A client that stops reading a fast stream holds the replica back (HTTP/2 flow
    control), not the native process's memory; a client's ``grpc-timeout`` ends the stream."""
    if request.node.callspec.params["instance"] != "native":
        pytest.skip("the native gRPC front only")
    ks, grpc_port = instance
    (proxy,) = ks.details()["proxies"].values()
    pid = int(proxy["worker_id"])
    stub = checks(channel)
    metadata = (("application", "checks"), ("request_id", "frozen-stream"))
    os.kill(pid, signal.SIGSTOP)
    try:
        call = stub.Count(ask("f", 50), metadata=metadata, timeout=20)
        assert [a.index for a in call] == list(range(50))
        assert ("request_id", "frozen-stream") in list(call.trailing_metadata())
        native, _ = _native_process(grpc_port)
        before = _rss_kib(native)
        # 1 KiB messages, far more than every window and buffer on the way: read 10, then pause
        slow = stub.Ticks(ask("x" * 1024, 10**6), metadata=metadata, timeout=30)
        for _, answer in zip(range(10), slow, strict=False):
            assert answer.text == "x" * 1024
        time.sleep(2)
        assert _rss_kib(native) - before < 32 * 1024  # KiB: not the stream's ~1 GiB
        slow.cancel()
        # the client's deadline (grpc-timeout) ends a stream the native front serves
        late = stub.Ticks(ask("d", 10**9), metadata=metadata, timeout=0.5)
        with pytest.raises(grpc.RpcError):
            for _ in late:
                pass
        assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # and the replica's slots were given back: calls still go through
        for _ in range(8):
            assert stub.Echo(ask("after"), metadata=metadata, timeout=10).text.startswith("after")
    finally:
        os.kill(pid, signal.SIGCONT)
