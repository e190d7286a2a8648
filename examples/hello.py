"""The smallest kubeserve application: one deployment answering HTTP.

curl localhost:8000/hello            ->  hello, world
curl 'localhost:8000/hello?name=you' ->  hello, you
"""

from kubeserve import Request, deployment


@deployment
class Hello:
    async def __call__(self, request: Request) -> str:
        return f"hello, {request.query_params.get('name', 'world')}\n"


app = Hello.bind()
