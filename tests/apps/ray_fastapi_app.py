"""A Ray Serve FastAPI ingress, written as Ray's documentation writes one (HTTP guide)."""

import asyncio
import os
from contextlib import asynccontextmanager
from typing import Optional

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from ray import serve


@asynccontextmanager
async def lifespan(app: FastAPI):
    yield {"greeting": "hello from lifespan"}
    marker = os.environ.get("RAY_APP_SHUTDOWN_MARKER")
    if marker:
        with open(marker, "w") as f:
            f.write("lifespan shutdown")


app = FastAPI(lifespan=lifespan)


@app.middleware("http")
async def add_process_header(request: Request, call_next):
    response = await call_next(request)
    response.headers["x-served-by"] = "middleware"
    return response


def current_user(x_user: Optional[str] = Header(default=None)) -> str:
    if x_user is None:
        raise HTTPException(status_code=401, detail="who are you?")
    return x_user


class Item(BaseModel):
    name: str
    price: float


@serve.deployment
@serve.ingress(app)
class MyFastAPIDeployment:
    def __init__(self):
        self.prefix = "item"

    @app.get("/")
    def root(self):
        return "Hello, world!"

    @app.get("/items/{item_id}")
    def read_item(self, item_id: int, q: Optional[str] = None):
        return {"kind": self.prefix, "item_id": item_id, "q": q}

    @app.post("/items")
    def create_item(self, item: Item):
        return {"name": item.name, "price": item.price}

    @app.get("/missing")
    def missing(self):
        raise HTTPException(status_code=404, detail="no such thing")

    @app.get("/whoami")
    def whoami(self, user: str = Depends(current_user)):
        return {"user": user}

    @app.get("/state")
    def state(self, request: Request):
        return {
            "greeting": request.state.greeting,
            "root_path": request.scope["root_path"],
            "url": str(request.url_for("state")),
            "replica": serve.get_replica_context().deployment,
        }

    @app.get("/stream")
    def stream(self):
        async def numbers():
            for i in range(3):
                yield f"{i}\n"
                await asyncio.sleep(0.5)

        return StreamingResponse(numbers(), media_type="text/plain")


fastapi_app = MyFastAPIDeployment.bind()
