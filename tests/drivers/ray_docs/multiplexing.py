# Model multiplexing: a loader decorated with @serve.multiplexed, the model id from an HTTP
# header or from handle.options(multiplexed_model_id=...), and an ingress forwarding it.
import requests
import starlette.requests
from ray import serve
from ray.serve.handle import DeploymentHandle


class FakeModel:
    def __init__(self, model_id: str):
        self.model_id = model_id

    def forward(self, data: str) -> str:
        return f"{self.model_id}:{data}"


@serve.deployment
class ModelInferencer:
    def __init__(self):
        self.loads = 0

    @serve.multiplexed(max_num_models_per_replica=3)
    async def get_model(self, model_id: str):
        self.loads += 1
        return FakeModel(model_id)

    async def __call__(self, request: starlette.requests.Request):
        model_id = serve.get_multiplexed_model_id()
        model = await self.get_model(model_id)
        return model.forward(request.query_params.get("data", "x"))

    async def predict(self, data: str) -> str:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.forward(data)


handle = serve.run(ModelInferencer.bind())

resp = requests.get("http://localhost:8000?data=a", headers={"serve_multiplexed_model_id": "1"})
assert resp.text == "1:a", resp.text
response = handle.options(multiplexed_model_id="2").predict.remote("<your param>")
assert response.result() == "2:<your param>"


@serve.deployment
class Downstream:
    def __call__(self):
        return serve.get_multiplexed_model_id()


@serve.deployment
class Upstream:
    def __init__(self, downstream: DeploymentHandle):
        self._h = downstream

    async def __call__(self, request: starlette.requests.Request):
        return await self._h.options(multiplexed_model_id="bar").remote()


serve.run(Upstream.bind(Downstream.bind()))
resp = requests.get("http://localhost:8000")
assert resp.text == "bar", resp.text
