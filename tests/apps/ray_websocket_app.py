"""Ray Serve WebSockets, written as Ray's documentation writes them (HTTP guide, "WebSockets"): a
FastAPI ingress whose ``@app.websocket`` routes echo text and bytes, take path and query
parameters, close from the server, and remember the clients that left; and a plain deployment,
which takes no WebSocket."""

from typing import List, Optional

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from ray import serve
from starlette.requests import Request

app = FastAPI()


@serve.deployment
@serve.ingress(app)
class EchoServer:
    def __init__(self):
        # The close code of every client that left an echo: what the handler saw.
        self.disconnects: List[int] = []

    @app.websocket("/")
    async def echo(self, ws: WebSocket):
        await ws.accept()
        try:
            while True:
                text = await ws.receive_text()
                await ws.send_text(text)
        except WebSocketDisconnect as exc:
            self.disconnects.append(exc.code)

    @app.websocket("/bytes")
    async def echo_bytes(self, ws: WebSocket):
        await ws.accept()
        try:
            while True:
                data = await ws.receive_bytes()
                await ws.send_bytes(data)
        except WebSocketDisconnect as exc:
            self.disconnects.append(exc.code)

    @app.websocket("/items/{item_id}")
    async def item(self, ws: WebSocket, item_id: int, q: Optional[str] = None):
        await ws.accept()
        await ws.send_json(
            {
                "item_id": item_id,
                "q": q,
                "path": ws.scope["path"],
                "root_path": ws.scope["root_path"],
            }
        )
        await ws.close(code=4000 + item_id, reason=f"done with item {item_id}")

    @app.get("/disconnects")
    def disconnects_seen(self):
        return self.disconnects


@serve.deployment
class Plain:
    async def __call__(self, request: Request):
        return "plain"


echo_app = EchoServer.bind()
plain_app = Plain.bind()
