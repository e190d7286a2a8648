"""Model multiplexing as Ray's documentation writes it, with one model per replica: each answer
says which replica served it and how many models that replica has loaded so far, so a test can
count loads (routing that ignores the model loads one per request)."""

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request


@serve.deployment(num_replicas=3)
class Models:
    def __init__(self):
        self.loads = 0
        self.replica = serve.get_replica_context().replica_tag

    @serve.multiplexed(max_num_models_per_replica=1)
    async def get_model(self, model_id: str) -> str:
        self.loads += 1
        return f"model {model_id}"

    async def __call__(self, request: Request) -> dict:
        if "who" in request.query_params:  # which replica answers, no model involved
            return await self.who()
        model = await self.get_model(serve.get_multiplexed_model_id())
        return {"model": model, "replica": self.replica, "loads": self.loads}

    async def who(self) -> dict:
        return {"replica": self.replica, "loads": self.loads}

    async def predict(self, x: int) -> dict:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return {"model": model, "replica": self.replica, "loads": self.loads, "x": x}

    async def stream_predict(self, x: int):
        model = await self.get_model(serve.get_multiplexed_model_id())
        yield {"model": model, "replica": self.replica, "loads": self.loads, "x": x}


@serve.deployment
class Caller:
    """``GET ?models=a,b,c&n=60``: n calls through a handle, cycling over the models (streamed
    calls with ``&stream=1``); ``GET ?who=n``: which replicas answer n calls without a model."""

    def __init__(self, models: DeploymentHandle):
        self.models = models

    async def __call__(self, request: Request) -> list:
        if "who" in request.query_params:
            n = int(request.query_params["who"])
            return [await self.models.who.remote() for _ in range(n)]
        model_ids = request.query_params["models"].split(",")
        stream = request.query_params.get("stream") == "1"
        answers = []
        for i in range(int(request.query_params["n"])):
            model_id = model_ids[i % len(model_ids)]
            if stream:
                handle = self.models.options(multiplexed_model_id=model_id, stream=True)
                answers += [item async for item in handle.stream_predict.remote(i)]
            else:
                handle = self.models.options(multiplexed_model_id=model_id)
                answers.append(await handle.predict.remote(i))
        return answers


models_app = Models.bind()
caller_app = Caller.bind(Models.bind())
