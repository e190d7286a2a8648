"""``ray.serve``'s decorator options, batching and multiplexing, without processes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubeserve.schema.support import SUPPORT
from kubeserve.sdk import context, ray_namespace
from kubeserve.sdk.errors import UnsupportedOptionError

ray_namespace.install()

from ray import serve  # noqa: E402
from ray.serve.config import AutoscalingConfig, RequestRouterConfig  # noqa: E402
from ray.serve.request_router import RequestRouter  # noqa: E402


class FirstReplicaRouter(RequestRouter):
    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        return [candidate_replicas[:1]]


def test_every_ray_decorator_option_is_honoured_or_refused_by_name() -> None:
    def target() -> None: ...

    honoured: dict[str, Any] = {
        "name": "D",
        "num_replicas": 2,
        "ray_actor_options": {"num_cpus": 0.5},
        "user_config": {"a": 1},
        "max_ongoing_requests": 3,
        "max_queued_requests": 10,
        "graceful_shutdown_wait_loop_s": 1.0,
        "graceful_shutdown_timeout_s": 5.0,
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 3.0,
        "logging_config": {"log_level": "DEBUG"},
        "request_router_config": {"request_routing_stats_period_s": 5},
        "backpressure_config": {"status_code": 503},
        "rolling_update_percentage": 0.5,
        "max_surge_percent": 10,
    }
    deployment = serve.deployment(**honoured)(target)
    assert deployment.name == "D"
    assert deployment.code_options["num_replicas"] == 2
    assert deployment.code_options["logging_config"] == {"log_level": "DEBUG"}
    assert deployment.code_options["max_surge_percent"] == 10
    refused = {
        "version": "1",
        "placement_group_bundles": [{"CPU": 1}],
        "placement_group_strategy": "PACK",
        "placement_group_bundle_label_selector": [{"a": "b"}],
        "max_replicas_per_node": 1,
        "max_constructor_retry_count": 3,
        "gang_scheduling_config": {"gang_size": 2},
        "deployment_actors": [{"name": "x", "actor_class": "m:C"}],
        "logging_config": {"logs_dir": "/var/log/serve"},
    }
    for option, value in refused.items():
        with pytest.raises(
            UnsupportedOptionError, match=f"{option}.*is not supported by kubeserve"
        ):
            serve.deployment(**{option: value})(target)
        with pytest.raises(ValueError, match=option):
            deployment.options(**{option: value})
    # None means "Ray's default" and is accepted for every option
    serve.deployment(**dict.fromkeys(refused))(target)


@pytest.mark.parametrize(
    ("option", "value", "decided_by"),
    [
        ("version", "1", "serve.deployment.version"),
        ("placement_group_strategy", "PACK", "DeploymentSchema.placement_group_strategy"),
        ("deployment_actors", [{"name": "x"}], "DeploymentSchema.deployment_actors"),
        ("logging_config", {"logs_dir": "/var/log"}, "LoggingConfig.logs_dir"),
    ],
)
def test_the_decorator_refuses_what_a_config_refuses_in_the_same_words(
    option: str, value: Any, decided_by: str
) -> None:
    with pytest.raises(UnsupportedOptionError) as in_code:
        serve.deployment(**{option: value})(len)
    assert SUPPORT[decided_by].status == "refused"
    assert f"is not supported by kubeserve: {SUPPORT[decided_by].note}" in str(in_code.value)


def test_values_of_config_fields_kubeserve_honours_are_accepted_in_code_as_in_a_config() -> None:
    """JSON logs and a 429 with Retry-After work in a config, so they work in code too."""
    options: dict[str, Any] = {
        "logging_config": {"encoding": "JSON", "additional_log_standard_attrs": ["name"]},
        "backpressure_config": {"status_code": 429, "retry_after_s": 3},
        "deployment_actors": [],  # asks for nothing, as a config may say
        "request_router_config": {
            "request_router_class": "my.module:Router",
            "request_router_kwargs": {"a": 1},
        },
    }
    deployment = serve.deployment(**options)(len)
    assert deployment.code_options == {
        "logging_config": options["logging_config"],
        "backpressure_config": options["backpressure_config"],
        "request_router_config": options["request_router_config"],
    }


def test_a_request_router_class_given_as_a_class_is_its_import_path() -> None:
    config = RequestRouterConfig(request_router_class=FirstReplicaRouter)
    assert config.request_router_class == f"{__name__}:FirstReplicaRouter"


def test_a_pydantic_config_is_recorded_as_the_fields_it_sets() -> None:
    deployment = serve.deployment(autoscaling_config=AutoscalingConfig(max_replicas=4))(len)
    assert deployment.code_options["autoscaling_config"] == {"max_replicas": 4}


def test_get_replica_context_outside_a_replica_raises() -> None:
    from ray.serve.exceptions import RayServeException

    with pytest.raises(RayServeException, match="get_replica_context"):
        serve.get_replica_context()


def test_batch_groups_concurrent_calls_and_keeps_their_order() -> None:
    sizes: list[int] = []

    class Model:
        @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
        async def double(self, xs: list[int]) -> list[int]:
            sizes.append(len(xs))
            return [x * 2 for x in xs]

    @serve.batch(max_batch_size=3, batch_wait_timeout_s=0.05)
    def sync_square(xs: list[int]) -> list[int]:
        return [x * x for x in xs]

    async def scenario() -> tuple[list[int], list[int]]:
        model = Model()
        doubled = await asyncio.gather(*(model.double(x) for x in range(10)))
        squared = await asyncio.gather(*(sync_square(x) for x in range(5)))
        return list(doubled), list(squared)

    doubled, squared = asyncio.run(scenario())
    assert doubled == [x * 2 for x in range(10)]
    assert squared == [x * x for x in range(5)]
    assert max(sizes) == 4 and sum(sizes) == 10


def test_batch_function_errors_reach_every_caller() -> None:
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=0.01)
    async def wrong_length(xs: list[int]) -> list[int]:
        return [1]

    async def scenario() -> list[Any]:
        return await asyncio.gather(wrong_length(1), wrong_length(2), return_exceptions=True)

    assert all(isinstance(r, TypeError) for r in asyncio.run(scenario()))


def test_multiplexed_loads_each_model_once_and_evicts_the_least_recently_used() -> None:
    loaded: list[str] = []
    unloaded: list[str] = []

    class Model:
        def __init__(self, model_id: str) -> None:
            self.model_id = model_id

        def __del__(self) -> None:  # Ray calls it on eviction (and awaits an async one)
            unloaded.append(self.model_id)

    class Server:
        @serve.multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str) -> Model:
            loaded.append(model_id)
            await asyncio.sleep(0.01)
            return Model(model_id)

        async def predict(self) -> str:
            model = await self.get_model(serve.get_multiplexed_model_id())
            return str(model.model_id)

    async def scenario() -> list[str]:
        server = Server()
        first = await asyncio.gather(*(server.get_model("a") for _ in range(3)))
        assert len({id(m) for m in first}) == 1
        await server.get_model("b")
        await server.get_model("a")
        await server.get_model("c")  # evicts b, the least recently used
        assert unloaded[:1] == ["b"]
        context.request_context.set(context.RequestContext(multiplexed_model_id="c"))
        return [await server.predict()]

    assert asyncio.run(scenario()) == ["c"]
    assert loaded == ["a", "b", "c"]


def test_the_driver_says_when_no_instance_answers_from_any_thread_or_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's admin calls run on its own loop: a script inside a running event loop (a
    notebook) gets the same answer as a plain one."""
    import socket

    from ray.serve.exceptions import RayServeException

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("KUBESERVE_ADDRESS", f"http://127.0.0.1:{port}")
    with pytest.raises(RayServeException, match="no kubeserve instance answers"):
        serve.status()

    async def inside_a_loop() -> None:
        serve.status()

    with pytest.raises(RayServeException, match="no kubeserve instance answers"):
        asyncio.run(inside_a_loop())
