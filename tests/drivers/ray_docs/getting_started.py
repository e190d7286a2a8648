# Getting started: a model as a deployment, tested over HTTP, then two models composed.
import requests
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request

WORDS = {"hello": "bonjour", "world": "monde", "good": "bon", "morning": "matin"}


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.2, "num_gpus": 0})
class Translator:
    def __init__(self):
        self.dictionary = WORDS

    def translate(self, text: str) -> str:
        return " ".join(self.dictionary.get(w, w) for w in text.lower().split())

    async def __call__(self, http_request: Request) -> str:
        english_text: str = await http_request.json()
        return self.translate(english_text)


translator_app = Translator.bind()
serve.run(translator_app)

response = requests.post("http://localhost:8000/", json="Hello world")
french_text = response.text
print(french_text)
assert french_text == "bonjour monde"


@serve.deployment
class Summarizer:
    def __init__(self, translator: DeploymentHandle):
        self.translator = translator

    def summarize(self, text: str) -> str:
        return " ".join(text.split()[:2])

    async def __call__(self, http_request: Request) -> str:
        english_text: str = await http_request.json()
        summary = self.summarize(english_text)
        translation = await self.translator.translate.remote(summary)
        return translation


app = Summarizer.bind(Translator.bind())
serve.run(app)

french_summary = requests.post("http://localhost:8000/", json="Good morning to you all").text
print(french_summary)
assert french_summary == "bon matin"
