"""Model multiplexing as Ray's documentation writes it."""

import os

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request


class Model:
    def __init__(self, model_id: str):
        self.model_id = model_id

    def predict(self, x: str) -> str:
        return f"{self.model_id}:{x}"


@serve.deployment
class ModelInferencer:
    def __init__(self):
        self.loads = 0

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        self.loads += 1
        return Model(model_id)

    async def __call__(self, request: Request):
        model_id = serve.get_multiplexed_model_id()
        model = await self.get_model(model_id)
        return {"prediction": model.predict("x"), "loads": self.loads, "pid": os.getpid()}

    async def predict(self, x: str) -> dict:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return {"prediction": model.predict(x), "loads": self.loads}


@serve.deployment
class Router:
    def __init__(self, inferencer: DeploymentHandle):
        self._inferencer = inferencer

    async def __call__(self, request: Request):
        model_id = request.query_params["model"]
        handle = self._inferencer.options(multiplexed_model_id=model_id)
        return await handle.predict.remote("y")


inferencer_app = ModelInferencer.bind()
router_app = Router.bind(ModelInferencer.bind())
