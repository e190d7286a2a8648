# Streaming responses: a generator behind a Starlette StreamingResponse, read chunk by chunk.
import asyncio
import time
from collections.abc import AsyncGenerator, Generator

import requests
from ray import serve
from starlette.requests import Request
from starlette.responses import StreamingResponse


@serve.deployment
class StreamingResponder:
    def generate_numbers(self, max: int) -> Generator[str, None, None]:
        for i in range(max):
            yield str(i)
            time.sleep(0.1)

    def __call__(self, request: Request) -> StreamingResponse:
        max = request.query_params.get("max", "25")
        gen = self.generate_numbers(int(max))
        return StreamingResponse(gen, status_code=200, media_type="text/plain")


serve.run(StreamingResponder.bind())

r = requests.get("http://localhost:8000?max=10", stream=True)
start = time.time()
r.raise_for_status()
chunks = []
for chunk in r.iter_content(chunk_size=None, decode_unicode=True):
    print(f"Got result {round(time.time() - start, 1)}s after start: '{chunk}'")
    chunks.append(chunk)
assert "".join(chunks) == "0123456789"
assert len(chunks) > 1, "the chunks came as they were made, not in one piece"


@serve.deployment
class ForeverResponder:
    async def generate_forever(self) -> AsyncGenerator[str, None]:
        try:
            i = 0
            while True:
                yield str(i)
                i += 1
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            print("Cancelled! Exiting.")

    def __call__(self, request: Request) -> StreamingResponse:
        gen = self.generate_forever()
        return StreamingResponse(gen, status_code=200, media_type="text/plain")


serve.run(ForeverResponder.bind())
r = requests.get("http://localhost:8000", stream=True)
r.raise_for_status()
for i, _chunk in enumerate(r.iter_content(chunk_size=None, decode_unicode=True)):
    if i == 5:
        print("Client disconnecting")
        break
r.close()
