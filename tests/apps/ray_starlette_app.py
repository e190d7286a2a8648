"""A plain Ray Serve deployment taking a Starlette request and returning a Starlette response."""

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse


@serve.deployment
class Echo:
    async def __call__(self, request: Request):
        if request.url.path.endswith("/text"):
            return PlainTextResponse("plain", status_code=202)
        form = (
            dict(await request.form())
            if request.method == "POST" and "form" in request.url.path
            else None
        )
        body = await request.json() if request.method == "POST" and form is None else None
        return JSONResponse(
            {
                "is_starlette": isinstance(request, Request),
                "path": request.url.path,
                "query": dict(request.query_params),
                "cookies": request.cookies,
                "body": body,
                "form": form,
            },
            status_code=201,
            headers={"x-echo": "yes"},
        )


app = Echo.bind()
