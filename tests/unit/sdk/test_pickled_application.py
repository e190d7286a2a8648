"""The application graph as serve.run ships it: what travels by value, and the error that names
what cannot be pickled."""

# mypy: disable-error-code="attr-defined"

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from kubeserve.sdk.application import Application
from kubeserve.sdk.deployment import deployment
from kubeserve.sdk.ingress import asgi_app_of, ingress
from kubeserve.sdk.pickled_application import (
    UnpicklableGraphError,
    pickle_application,
    unpickle_application,
)


def _graph_in_a_function(greeting: str) -> Application:
    @deployment
    class Greeter:
        def __init__(self, punctuation: str) -> None:
            self.punctuation = punctuation

        def greet(self, name: str) -> str:
            return f"{greeting}, {name}{self.punctuation}"

    @deployment
    class Front:
        def __init__(self, greeters: list[Any]) -> None:
            self.greeters = greeters

    return Front.bind([Greeter.bind("!")])


def test_a_graph_defined_in_a_function_round_trips_with_its_closure() -> None:
    app = unpickle_application(pickle_application(_graph_in_a_function("Hello")))
    assert [node.name for node in app.deployments()] == ["Front", "Greeter"]
    greeter = app.deployments()[1]
    instance = greeter.deployment.func_or_class(*greeter.args)
    assert instance.greet("Ada") == "Hello, Ada!"


def test_a_lock_among_bound_arguments_is_named() -> None:
    @deployment
    class Guarded:
        def __init__(self, settings: dict[str, Any]) -> None:
            self.settings = settings

    app = Guarded.bind({"retries": 3, "lock": threading.Lock()})
    with pytest.raises(UnpicklableGraphError) as caught:
        pickle_application(app)
    assert "argument 0 of Guarded.bind()['lock'] (a _thread.lock)" in str(caught.value)


def test_a_socket_held_by_a_bound_object_is_named() -> None:
    class Client:
        def __init__(self) -> None:
            self.connection = socket.socket()

    @deployment
    class Model:
        def __init__(self, client: Client) -> None:
            self.client = client

    @deployment
    class Front:
        def __init__(self, model: Any) -> None:
            self.model = model

    client = Client()
    try:
        with pytest.raises(UnpicklableGraphError) as caught:
            pickle_application(Front.bind(Model.bind(client=client)))
        assert "argument 'client' of Model.bind().connection (a socket.socket)" in str(caught.value)
    finally:
        client.connection.close()


def test_a_lock_the_class_refers_to_is_named() -> None:
    lock = threading.Lock()

    @deployment
    class Locked:
        def __call__(self) -> None:
            with lock:
                pass

    with pytest.raises(UnpicklableGraphError) as caught:
        pickle_application(Locked.bind())
    assert "the class of deployment 'Locked'" in str(caught.value)
    assert "(variable 'lock') (a _thread.lock)" in str(caught.value)


def test_a_fastapi_ingress_with_class_based_views_round_trips() -> None:
    fastapi = pytest.importorskip("fastapi")
    api = fastapi.FastAPI()
    api.state.greeting = "hi"

    @deployment
    @ingress(api)
    class Front:
        @api.get("/hello/{name}")
        def hello(self, name: str) -> dict[str, str]:
            return {"hello": name}

    app = unpickle_application(pickle_application(Front.bind()))
    served = asgi_app_of(app.deployment.func_or_class)
    assert served.state.greeting == "hi"
    paths = {getattr(r, "path", None) for r in served.router.routes}
    assert "/openapi.json" in paths


def test_code_pickled_by_value_keeps_the_file_it_was_defined_in() -> None:
    """As Ray's cloudpickle keeps it (upstream cloudpickle writes ``<dynamic-code>``): a traceback
    from the deployment's code names the file and, where the file exists, shows its lines."""
    app = unpickle_application(pickle_application(_graph_in_a_function("Hello")))
    greeter = app.deployments()[1].deployment.func_or_class
    assert greeter.greet.__code__.co_filename == __file__
