"""What a replica tells its callers about the models it holds: every ``@multiplexed`` cache of the
process, most recently used first, and a version that moves whenever that may have changed."""

from __future__ import annotations

import asyncio

from kubeserve.sdk.multiplex import loaded_model_ids, models_version, multiplexed


def test_loaded_models_follow_loads_uses_and_evictions() -> None:
    class Server:
        @multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str) -> str:
            return model_id.upper()

    async def scenario() -> None:
        server = Server()
        mine = {"a", "b", "c"}

        def held() -> list[str]:
            return [m for m in loaded_model_ids() if m in mine]

        start = models_version()
        await server.get_model("a")
        await server.get_model("b")
        assert held() == ["b", "a"] and models_version() > start
        seen = models_version()
        await server.get_model("b")  # already the most recent: nothing changed
        assert models_version() == seen
        await server.get_model("a")
        assert held() == ["a", "b"] and models_version() > seen
        await server.get_model("c")  # evicts b
        assert held() == ["c", "a"]

    asyncio.run(scenario())


def test_every_cache_of_the_process_counts() -> None:
    @multiplexed(max_num_models_per_replica=1)
    def load_x(model_id: str) -> str:
        return model_id

    @multiplexed(max_num_models_per_replica=1)
    def load_y(model_id: str) -> str:
        return model_id

    async def scenario() -> None:
        await load_x("x1")
        await load_y("y1")
        assert {"x1", "y1"} <= set(loaded_model_ids())

    asyncio.run(scenario())
