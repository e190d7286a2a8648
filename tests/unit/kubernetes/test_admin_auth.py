"""The operator's admin API access control, against a recording stand-in for the API server.

The real API server answers the same reviews in ``tests/kubernetes/test_admin_api_k8s.py``; here:
which rights each request needs, the 401/403 answers, and that decisions are cached.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kubeserve.backends.kubernetes.admin_auth import (
    Access,
    KubernetesAuthorizer,
    required_access,
)
from kubeserve.runtime.kubernetes.client import KubeError


class FakeKube:
    """Answers TokenReviews (``tokens``: token -> username) and SubjectAccessReviews
    (``grants``: username -> allowed (verb, resource) pairs); records every review."""

    def __init__(self, tokens: dict[str, str], grants: dict[str, set[tuple[str, str]]]) -> None:
        self.tokens, self.grants = tokens, grants
        self.reviews: list[tuple[str, Any]] = []
        self.down = False

    async def create(self, kind: str, namespace: str | None, body: dict[str, Any]) -> Any:
        if self.down:
            raise KubeError(500, "InternalError", "etcd is on fire")
        assert namespace is None  # both reviews are cluster-scoped
        spec = body["spec"]
        self.reviews.append((kind, spec))
        if kind == "TokenReview":
            user = self.tokens.get(spec["token"])
            if user is None:
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True, "user": {"username": user, "groups": ["g"]}}}
        attributes = spec["resourceAttributes"]
        assert attributes["namespace"] == "ops" and attributes["group"] == "kubeserve.io"
        allowed = (attributes["verb"], attributes["resource"]) in self.grants.get(spec["user"], ())
        return {"status": {"allowed": allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


EVERYTHING = {
    (verb, resource)
    for verb in ("get", "list", "create", "patch", "delete")
    for resource in ("serveinstances", "serveapplications")
}


def run(scenario: Any) -> None:
    asyncio.run(scenario())


async def client_for(kube: FakeKube, clock: Clock) -> TestClient[web.Request, web.Application]:
    authorizer = KubernetesAuthorizer(kube, "ops", clock=clock)  # type: ignore[arg-type]

    async def ok(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[authorizer.middleware])
    app.router.add_route("*", "/{tail:.*}", ok)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def test_each_request_needs_the_rights_its_handler_uses() -> None:
    read = {Access("get", "serveinstances"), Access("list", "serveapplications")}
    assert set(required_access("GET", "/api/serve/applications/") or ()) == read
    assert set(required_access("GET", "/api/serve/deployments") or ()) == read
    status = set(required_access("GET", "/api/serve/deployments/status") or ())
    assert status == read | {Access("create", "serveinstances")}
    put = set(required_access("PUT", "/api/serve/applications/") or ())
    assert put >= read
    assert {(a.verb, a.resource) for a in put - read} == {
        ("create", "serveinstances"),
        ("patch", "serveinstances"),
        ("create", "serveapplications"),
        ("patch", "serveapplications"),
        ("delete", "serveapplications"),
    }
    assert set(required_access("PUT", "/api/serve/deployments/") or ()) == put
    scale = required_access("POST", "/api/v1/applications/My%20App/deployments/D/scale")
    assert {(a.verb, a.resource) for a in scale or ()} == {
        ("list", "serveapplications"),
        ("patch", "serveapplications"),
    }
    assert {(a.verb, a.resource) for a in required_access("DELETE", "/api/serve/deployments/")} == {
        ("delete", "serveinstances"),
        ("list", "serveapplications"),
        ("delete", "serveapplications"),
    }
    imperative = required_access("PUT", "/api/kubeserve/applications/My%20App")
    assert {(a.verb, a.resource) for a in imperative or ()} == {
        ("get", "serveinstances"),
        ("create", "serveinstances"),
        ("patch", "serveinstances"),
        ("list", "serveapplications"),
        ("create", "serveapplications"),
        ("patch", "serveapplications"),
    }
    delete_one = required_access("DELETE", "/api/kubeserve/applications/app")
    assert {(a.verb, a.resource) for a in delete_one or ()} == {
        ("list", "serveapplications"),
        ("delete", "serveapplications"),
    }
    assert required_access("GET", "/-/healthz") is None  # open
    assert required_access("GET", "/api/ray/version") == ()  # authenticated only
    assert required_access("POST", "/anything/else") == ()


def test_401_403_and_allowed_answers() -> None:
    async def scenario() -> None:
        kube = FakeKube(
            {"t-admin": "admin", "t-viewer": "viewer"},
            {
                "admin": EVERYTHING,
                "viewer": {("get", "serveinstances"), ("list", "serveapplications")},
            },
        )
        client = await client_for(kube, Clock())
        try:
            for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer nope"}):
                response = await client.get("/api/serve/applications/", headers=headers)
                assert response.status == 401
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                assert "error" in await response.json()
            assert (await client.get("/-/healthz")).status == 200
            viewer = {"Authorization": "Bearer t-viewer"}
            assert (await client.get("/api/serve/applications/", headers=viewer)).status == 200
            response = await client.put("/api/serve/applications/", headers=viewer)
            assert response.status == 403
            message = (await response.json())["error"]
            assert 'user "viewer"' in message and 'namespace "ops"' in message
            assert "create serveinstances.kubeserve.io" in message
            assert "get serveinstances" not in message  # only what is missing
            admin = {"Authorization": "Bearer t-admin"}
            assert (await client.put("/api/serve/applications/", headers=admin)).status == 200
            assert (await client.delete("/api/serve/deployments/", headers=admin)).status == 200
        finally:
            await client.close()

    run(scenario)


def test_decisions_are_cached_for_ten_seconds() -> None:
    async def scenario() -> None:
        kube = FakeKube({"t": "admin"}, {"admin": EVERYTHING})
        clock = Clock()
        client = await client_for(kube, clock)
        headers = {"Authorization": "Bearer t"}
        try:
            for _ in range(20):  # a polling client
                assert (await client.get("/api/serve/applications/", headers=headers)).status == 200
            kinds = [kind for kind, _ in kube.reviews]
            assert kinds.count("TokenReview") == 1
            assert kinds.count("SubjectAccessReview") == 2  # get instance, list applications
            # the token goes to the TokenReview only, never into an access review
            assert all("token" not in spec for kind, spec in kube.reviews if kind != "TokenReview")
            kube.grants["admin"] = set()  # access revoked: seen once the decisions expire
            clock.now += 9
            assert (await client.get("/api/serve/applications/", headers=headers)).status == 200
            clock.now += 2
            assert (await client.get("/api/serve/applications/", headers=headers)).status == 403
            kube.down = True  # the API server cannot answer: 503, not a wrong decision
            clock.now += 11
            response = await client.get("/api/serve/applications/", headers=headers)
            assert response.status == 503
        finally:
            await client.close()

    run(scenario)


@pytest.mark.parametrize("header", ["Bearer", "Bearer   ", "bearer"])
def test_empty_bearer_is_401(header: str) -> None:
    async def scenario() -> None:
        client = await client_for(FakeKube({}, {}), Clock())
        try:
            response = await client.get(
                "/api/serve/applications/", headers={"Authorization": header}
            )
            assert response.status == 401
        finally:
            await client.close()

    run(scenario)
