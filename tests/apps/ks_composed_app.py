"""Test application: an ingress with handles to two downstream deployments, one inside a dict."""

# mypy keeps the class type under a class decorator (python/mypy#3135), so it cannot see that
# @deployment turned the class into a Deployment with .bind() and .options().
# mypy: disable-error-code="attr-defined"

from __future__ import annotations

from typing import Any

from kubeserve import DeploymentHandle, Request, deployment


@deployment(num_replicas=3, ray_actor_options={"num_cpus": 0.5}, route_prefix="/model")
class Model:
    def __init__(self, weight: int) -> None:
        self.weight = weight

    def predict(self, x: int) -> int:
        return x * self.weight


@deployment
def tokenizer(text: str) -> list[str]:
    return text.split()


@deployment(max_concurrent_queries=5, health_check_period_s=2.5)
class Ingress:
    def __init__(self, model: DeploymentHandle, helpers: dict[str, Any]) -> None:
        self.model = model
        self.tokenizer: DeploymentHandle = helpers["tokenizer"]

    async def __call__(self, request: Request) -> dict[str, Any]:
        words = await self.tokenizer.remote(request.query_params.get("q", ""))
        scores = [await self.model.predict.remote(len(w)) for w in words]
        return {"words": words, "scores": scores}


app = Ingress.bind(Model.bind(2), {"tokenizer": tokenizer.bind()})
