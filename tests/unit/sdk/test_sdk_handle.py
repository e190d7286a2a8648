"""DeploymentHandle: calls go through the installed transport; handles pickle by name."""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from kubeserve import DeploymentHandle
from kubeserve.sdk import transport


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, tuple[Any, ...], dict[str, Any]]] = []

    async def call(
        self, app: str, deployment: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self.calls.append((app, deployment, method, args, kwargs))
        if method == "fail":
            raise KeyError("from replica")
        return (method, args, kwargs)


@pytest.fixture
def recorder() -> Iterator[RecordingTransport]:
    installed = RecordingTransport()
    transport.set_transport(installed)
    yield installed
    transport.set_transport(None)


def test_remote_calls_dunder_call_and_named_methods(recorder: RecordingTransport) -> None:
    handle = DeploymentHandle("app1", "Model")

    async def scenario() -> list[Any]:
        return [
            await handle.remote(1, k=2),
            await handle.predict.remote("x"),
            await handle.options(method_name="score").remote(),
        ]

    results = asyncio.run(scenario())
    assert results == [("__call__", (1,), {"k": 2}), ("predict", ("x",), {}), ("score", (), {})]
    assert [c[:3] for c in recorder.calls] == [
        ("app1", "Model", "__call__"),
        ("app1", "Model", "predict"),
        ("app1", "Model", "score"),
    ]


def test_responses_passed_as_arguments_are_resolved(recorder: RecordingTransport) -> None:
    handle = DeploymentHandle("a", "D")

    async def scenario() -> Any:
        first = handle.remote(1)
        return await handle.combine.remote(first, other=handle.remote(2))

    result = asyncio.run(scenario())
    assert result == (
        "combine",
        (("__call__", (1,), {}),),
        {"other": ("__call__", (2,), {})},
    )


def test_exceptions_of_the_callee_propagate(recorder: RecordingTransport) -> None:
    async def scenario() -> None:
        await DeploymentHandle("a", "D").fail.remote()

    with pytest.raises(KeyError, match="from replica"):
        asyncio.run(scenario())


def test_without_transport_the_call_fails_clearly() -> None:
    async def scenario() -> None:
        await DeploymentHandle("a", "D").remote()

    with pytest.raises(RuntimeError, match="no handle transport"):
        asyncio.run(scenario())


def test_handles_pickle_by_name() -> None:
    handle = DeploymentHandle("app1", "Model").options(method_name="predict")
    clone = pickle.loads(pickle.dumps(handle))
    assert isinstance(clone, DeploymentHandle)
    assert (clone.app_name, clone.deployment_name, clone.method_name) == (
        "app1",
        "Model",
        "predict",
    )
    assert clone == handle and hash(clone) == hash(handle)
    assert copy.deepcopy(handle) == handle
    assert pickle.loads(pickle.dumps({"h": [DeploymentHandle("a", "b")]}))["h"][0].app_name == "a"


def test_private_attributes_are_not_methods() -> None:
    with pytest.raises(AttributeError):
        DeploymentHandle("a", "b")._private  # noqa: B018
