"""A second version of ``examples.hello``: same deployment name, another answer."""

from kubeserve import Request, deployment


@deployment
class Hello:
    async def __call__(self, request: Request) -> str:
        return "hello v2\n"


app = Hello.bind()
