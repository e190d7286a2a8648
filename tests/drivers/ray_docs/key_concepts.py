# Key concepts: a deployment, its handle from the driver, an ingress composing two models, and
# a FastAPI ingress.
import ray
import requests
import starlette.requests
from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponse

ray.init()


@serve.deployment
class MyFirstDeployment:
    # The message it answers with is an argument of the constructor.
    def __init__(self, msg):
        self.msg = msg

    def __call__(self):
        return self.msg


my_first_deployment = MyFirstDeployment.bind("Hello world!")
handle: DeploymentHandle = serve.run(my_first_deployment)
assert handle.remote().result() == "Hello world!"
print(requests.get("http://localhost:8000/").text)


@serve.deployment
class Hello:
    def __call__(self) -> str:
        return "Hello"


@serve.deployment
class World:
    def __call__(self) -> str:
        return " world!"


@serve.deployment
class Ingress:
    def __init__(self, hello_handle: DeploymentHandle, world_handle: DeploymentHandle):
        self._hello_handle = hello_handle
        self._world_handle = world_handle

    async def __call__(self) -> str:
        hello_response: DeploymentResponse = self._hello_handle.remote()
        world_response: DeploymentResponse = self._world_handle.remote()
        return (await hello_response) + (await world_response)


hello = Hello.bind()
world = World.bind()

# The handles of hello and world are passed to Ingress's constructor.
app = Ingress.bind(hello, world)
handle = serve.run(app)
assert handle.remote().result() == "Hello world!"


@serve.deployment
class MostBasicIngress:
    async def __call__(self, request: starlette.requests.Request) -> str:
        name = (await request.json())["name"]
        return f"Hello {name}!"


serve.run(MostBasicIngress.bind())
print(requests.get("http://localhost:8000/", json={"name": "Corey"}).text)
assert requests.get("http://localhost:8000/", json={"name": "Corey"}).text == "Hello Corey!"

fastapi_app = FastAPI()


@serve.deployment
@serve.ingress(fastapi_app)
class FastAPIIngress:
    @fastapi_app.get("/{name}")
    async def say_hi(self, name: str) -> str:
        return f"Hello {name}"


serve.run(FastAPIIngress.bind())
assert requests.get("http://localhost:8000/Theodore").json() == "Hello Theodore"
